"""Many clusters on one PostgreSQL: duplicates, fairness, throughput and the idle cost.

    python -m bench.clusters [--clusters 1 2 4] [--hosts 400] [--rate 50] [--seconds 10]
                             [--idle 10] [--modes listen probe]

For each number of clusters, that many ``manage.py qcluster`` processes (two workers each, as
on separate machines) share the bench database and one queue (django-q's cluster ``name``,
which is also the ``cluster`` the alarm slots carry, ``ALARM_CLUSTER``: a cluster under another
name would fire none of them). Scenarios, each on fresh hosts:

- ``idle``: no alarm for ``--idle`` seconds: the database's transactions per second
  (``pg_stat_database.xact_commit + xact_rollback`` of the bench database) are what the probes,
  the listeners' reconnects and django-q's polls cost;
- ``burst``: ``--hosts`` alarms all due at the same instant;
- ``steady``: ``--rate`` alarms per second for ``--seconds`` seconds.

Each host is armed once, through the ``bench-clock`` lane (``bench/benchapp/lanes.py``), whose
handler records the host, its start and its cluster. A duplicate is a handler run beyond the
first for a host; a starved host is one whose handler never ran. The database's transactions
per second are counted from arming to the last handler start (arming and the passes included).
``listen`` is ``AlarmBroker``, ``probe`` the same without its LISTEN wake-up (every cluster
probes every 0.1 s).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import cluster, machine, percentile, reset, setup, table, wait_for
from bench.lateness import BROKERS, LANE, prepare


def transactions() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def handler_runs(directory: str) -> list[tuple[int, float, str]]:
    runs = []
    for path in Path(directory).glob("*.log"):
        for line in path.read_text().splitlines():
            host, started, name = line.split()
            runs.append((int(host), float(started), name))
    return runs


def run(mode: str, clusters: int, scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    from django.db import connection
    from django.utils import timezone

    from durable_agent.maintenance import gate

    reset()
    count = {"idle": 0, "burst": args.hosts, "steady": round(args.rate * args.seconds)}[scenario]
    host_ids = prepare(count)
    records = tempfile.mkdtemp(prefix="bench-clusters-")
    result: dict[str, Any] = {}
    try:
        with ExitStack() as stack:
            for k in range(clusters):
                env = {
                    "Q_BROKER_CLASS": BROKERS["orm", mode],
                    "BENCH_HANDLER_DIR": records,
                    "BENCH_CLUSTER": f"c{k}",
                }
                stack.enter_context(cluster(env=env))
            time.sleep(5)  # every cluster started, its start-up sweep done
            if scenario == "idle":
                connection.close()  # our own queries stay out of the count below
                before, started = transactions(), time.monotonic()
                time.sleep(args.idle)
                after, elapsed = transactions(), time.monotonic() - started
                result["xact_per_s"] = (after - before - 1) / elapsed
                return result
            connection.close()
            before, started = transactions(), time.monotonic()
            start = timezone.now() + timedelta(seconds=2 + 0.06 * count)
            step = 0.0 if scenario == "burst" else 1 / args.rate
            for i, host_id in enumerate(host_ids):
                gate.schedule(host_id, LANE, start + timedelta(seconds=i * step))
            if timezone.now() >= start:
                raise SystemExit("arming took too long: past the first deadline")
            due_until = start + timedelta(seconds=count * step)
            wait_for(
                lambda: len({r[0] for r in handler_runs(records)}) >= count,
                timeout=(due_until - timezone.now()).total_seconds() + 60,
                interval=0.5,
            )
            after, elapsed = transactions(), time.monotonic() - started
            result["xact_per_s"] = (after - before) / elapsed
            time.sleep(2)  # a duplicate delivery would show up by now
        runs = handler_runs(records)
    finally:
        shutil.rmtree(records, ignore_errors=True)
    per_host = Counter(host for host, _, _ in runs)
    first = sorted(started for _, started, _ in runs)
    elapsed = (first[-1] - first[0]) if len(first) > 1 else float("nan")
    per_cluster = Counter(name for _, _, name in runs)
    result.update(
        runs=len(runs),
        duplicates=sum(n - 1 for n in per_host.values()),
        starved=count - len(per_host),
        per_cluster=[per_cluster.get(f"c{k}", 0) for k in range(clusters)],
        elapsed=elapsed,
        total_per_s=len(runs) / elapsed if elapsed else float("nan"),
        start_spread_ms=(percentile(first, 99) - percentile(first, 0)) * 1000,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clusters", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--hosts", type=int, default=400, help="alarms in the burst")
    parser.add_argument("--rate", type=float, default=50.0, help="alarms/s in the steady run")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--modes", nargs="+", default=["listen", "probe"])
    parser.add_argument("--scenarios", nargs="+", default=["idle", "burst", "steady"])
    args = parser.parse_args()
    setup()
    rows, idle_rows = [], []
    for mode in args.modes:
        for clusters in args.clusters:
            for scenario in args.scenarios:
                r = run(mode, clusters, scenario, args)
                if scenario == "idle":
                    idle_rows.append([mode, clusters, r["xact_per_s"]])
                    continue
                rows.append(
                    [
                        mode,
                        clusters,
                        scenario,
                        r["runs"],
                        r["duplicates"],
                        r["starved"],
                        " / ".join(str(n) for n in r["per_cluster"]),
                        r["elapsed"],
                        r["total_per_s"],
                        r["xact_per_s"],
                    ]
                )
    where = f"2 workers per cluster ({machine()})"
    if idle_rows:
        table(
            f"Idle cost of the clusters: database transactions per second, {where}",
            ["mode", "clusters", "transactions/s"],
            idle_rows,
        )
    if rows:
        table(
            f"Alarms fired by many clusters (burst {args.hosts}, steady {args.rate:g}/s "
            f"for {args.seconds:g} s), {where}",
            [
                "mode",
                "clusters",
                "scenario",
                "handler runs",
                "duplicates",
                "starved hosts",
                "runs per cluster",
                "first to last start s",
                "total runs/s",
                "db transactions/s",
            ],
            rows,
        )


if __name__ == "__main__":
    main()
