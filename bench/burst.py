"""Burst drain: every host's lane due at the same instant, drained by a live 2-worker cluster.

    python -m bench.burst [--hosts 1000] [--runs 3] [--workers 2] [--lead 3]

``--hosts`` hosts, each caught up by its first-use pass, get one ``burst`` host lane (its
handler inserts one ``Fact`` row) scheduled with ``gate.schedule`` for the same instant, a few
seconds (``--lead``) ahead, while the cluster (the example project's settings: ``AlarmBroker``,
``bulk`` 4, persistent connections with health checks) is already running. Measured from the
due instant until every handler row is inserted, no slot is armed and the broker queue is
empty: hosts per second. The lateness columns come from the ``PassRecord`` rows (pass start
minus the deadline) and from the handler rows (handler start minus the deadline). The median
run by rate is printed, with every run's rate, then every run in the order run with its rate
against the median and what the server did in the background meanwhile (checkpoints,
autovacuum and autoanalyze runs), to tell a slow run's cause.

Each run also reads, from ``/proc``, the CPU time its processes spent between the due
instant and the drain, per drained host: the cluster's processes (its two busiest apart: in a
burst, the workers), PostgreSQL's (every process of the server), and how busy the machine's
cores were. ``--profile out.txt`` samples the cluster with py-spy, idle threads included;
``--profile-gil`` samples only threads that hold the GIL (Python's own CPU: psycopg's waits
for the server release it).

``--count N`` then runs ``N`` hosts once more (not timed: tracing slows every statement) on a
cluster traced by ``bench/trace.py`` and counts, over every process of the cluster, what the
database saw from the due instant until the burst drained: statements (the firing, django-q's
claim and acknowledgement, the task's result row, the pass, its record, the handler's own
insert), commits and connection health checks, per drained host, and the statements by the
span that ran them (the firing, the alarm task and its pass, django-q's own work outside
them), then each statement's text (its first characters) with its count per drained host.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import cluster, machine, reset, setup, summary, table, wait_for


def run(
    hosts: int,
    workers: int,
    lead: float,
    profile: str | None = None,
    trace_dir: str | None = None,
    gil: bool = False,
) -> list[Any]:
    from django.utils import timezone
    from django_q.models import OrmQ, Schedule

    from bench.benchapp.models import Fact
    from bench.lateness import prepare
    from durable_agent.maintenance import gate
    from durable_agent.models import Host, PassRecord

    reset()
    Fact.objects.all().delete()
    host_ids = prepare(hosts)
    slots = list(Host.objects.exclude(alarm=None).values_list("alarm_id", flat=True))

    def drained() -> bool:
        if Fact.objects.count() < hosts:
            return False
        armed = Schedule.objects.filter(pk__in=slots).exclude(repeats=0).exists()
        return not armed and not OrmQ.objects.exists()

    env = None if trace_dir is None else {"BENCH_TRACE_DIR": trace_dir}
    with cluster(fast=True, workers=workers, env=env) as process:
        time.sleep(4)  # let the cluster start
        due = timezone.now() + timedelta(seconds=lead + 0.03 * hosts)
        for host_id in host_ids:
            gate.schedule(host_id, "burst", due)
        if timezone.now() >= due:
            raise SystemExit("arming took longer than the lead; raise --lead")
        spy = None if profile is None else py_spy(process.pid, profile, gil=gil)
        wait_for(lambda: timezone.now() >= due, timeout=lead + 0.03 * hosts + 5, interval=0.005)
        server_before = server_work()
        cpu_before = cpu_reading(process.pid)
        done = wait_for(drained, timeout=300, interval=0.02)
        cpu_during = cpu_reading(process.pid) - cpu_before
        seconds = (timezone.now() - due).total_seconds()
        server_during = server_work() - server_before
        if trace_dir is not None:
            (Path(trace_dir) / "window").write_text(f"{due.timestamp()} {time.time()}")
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its flame graph on SIGINT
            spy.wait(timeout=60)
    rows = Fact.objects.count()
    pass_late = [
        float(v)
        for v in PassRecord.objects.exclude(lateness_ms=None).values_list("lateness_ms", flat=True)
    ]
    rows_at = Fact.objects.values_list("created_at", flat=True)
    handler_late = [(at - due).total_seconds() * 1000 for at in rows_at]
    p, h = summary(pass_late), summary(handler_late)
    first = PassRecord.objects.order_by("started_at").values_list("started_at", flat=True).first()
    first_ms = float("nan") if first is None else (first - due).total_seconds() * 1000
    # Pass start -> handler start, per pass (the handler row's time minus its pass's start).
    starts = dict(PassRecord.objects.values_list("host_id", "started_at"))
    to_handler = [
        (at - starts[host_id]).total_seconds() * 1000
        for host_id, at in Fact.objects.values_list("host_id", "created_at")
        if host_id in starts
    ]
    return [
        hosts,
        rows,
        "yes" if done else "no",
        seconds,
        hosts / seconds,
        first_ms,
        p["p50"],
        summary(to_handler)["p50"],
        h["p50"],
        h["max"],
        ", ".join(f"{name} {n}" for name, n in sorted(server_during.items()) if n) or "none",
        *cpu_per_host(cpu_during, rows),
    ]


def server_work() -> Counter[str]:
    """What the server did in the background so far: checkpoints, and autovacuum and
    autoanalyze runs on every table (subtract two readings for a window). The statistics
    views lag by up to their flush interval (about a second)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter),"
            " sum(autovacuum_count), sum(autoanalyze_count) FROM pg_stat_user_tables"
        )
        checkpoints, vacuums, analyzes = cursor.fetchone()
    return Counter(
        {
            "checkpoints": int(checkpoints or 0),
            "autovacuums": int(vacuums or 0),
            "autoanalyzes": int(analyzes or 0),
        }
    )


def cpu_reading(cluster_pid: int) -> Counter[str]:
    """CPU seconds so far of the cluster's processes (``cluster``, and each process as
    ``pid <n>``), of PostgreSQL's, and of the machine (``busy`` and ``all``, from /proc/stat).
    Subtract two readings for a window; a process that ended between them is not counted."""
    from bench.connections import descendants

    tick = os.sysconf("SC_CLK_TCK")
    cluster = descendants(cluster_pid)
    reading: Counter[str] = Counter()
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = path.read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick
        if int(path.parent.name) in cluster:
            reading["cluster"] += seconds
            reading[f"pid {path.parent.name}"] += seconds
        elif name == "postgres":
            reading["postgres"] += seconds
    cpu = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    reading["all"] = sum(cpu) / tick
    reading["busy"] = (sum(cpu) - cpu[3] - cpu[4]) / tick  # less idle and iowait
    return reading


def cpu_per_host(during: Counter[str], drained: int) -> list[float]:
    """Milliseconds of CPU per drained host: the cluster's two busiest processes (a burst's
    workers), its other processes, PostgreSQL; and the cores' busy share in percent."""
    per = 1000 / max(drained, 1)
    busiest = sorted((v for k, v in during.items() if k.startswith("pid ")), reverse=True)[:2]
    return [
        sum(busiest) * per,
        (during["cluster"] - sum(busiest)) * per,
        during["postgres"] * per,
        100 * during["busy"] / during["all"] if during["all"] else float("nan"),
    ]


def counted(hosts: int, workers: int, lead: float) -> tuple[list[Any], list[list[Any]]]:
    """One traced run of ``hosts`` hosts: what the database saw per drained host, in all (by
    the span that ran it) and statement by statement (the first ``SHOWN`` characters of each
    statement's text and its outermost span, a row each, most frequent first)."""
    directory = tempfile.mkdtemp(prefix="bench-burst-trace-")
    outcome = run(hosts, workers, lead, trace_dir=directory)
    start, end = (float(v) for v in (Path(directory) / "window").read_text().split())
    kinds: Counter[str] = Counter()
    by_span: Counter[str] = Counter()
    by_text: Counter[tuple[str, str]] = Counter()
    for path in Path(directory).glob("trace-*.tsv"):
        lines = [line.split("\t") for line in path.read_text().splitlines()]
        spans = [
            (float(a), float(b), thread, name)
            for a, b, _, thread, kind, name in lines
            if kind == "span"
        ]
        for a, _, _, thread, kind, name in lines:
            if not start <= float(a) <= end or kind not in ("sql", "commit", "health"):
                continue
            kinds[kind] += 1
            span = _outermost(spans, float(a), thread)
            by_text[(span, name[:SHOWN] if kind == "sql" else kind)] += 1
            if kind == "sql":
                by_span[span] += 1
    drained = max(int(outcome[1]), 1)
    per = {k: kinds[k] / drained for k in ("sql", "commit", "health")}
    shown = ", ".join(f"{name} {n / drained:.2f}" for name, n in by_span.most_common())
    texts = [[f"{n / drained:.3f}", span, text] for (span, text), n in by_text.most_common()]
    return [hosts, int(outcome[1]), per["sql"], per["commit"], per["health"], shown], texts


#: How much of a statement's text ``counted`` shows.
SHOWN = 90


def _outermost(spans: list[tuple[float, float, str, str]], at: float, thread: str) -> str:
    """The outermost traced span of ``thread`` around ``at``: the firing, an alarm
    transaction, or none (django-q's own work: claiming, acknowledging, saving the result;
    and, in a delivery, what runs between its traced transactions: the group's begin, the
    lane handlers' own statements)."""
    enclosing = [s for s in spans if s[2] == thread and s[0] <= at <= s[1]]
    if not enclosing:
        return "no traced span (django-q, a group's begin, handlers)"
    name = max(enclosing, key=lambda s: s[1] - s[0])[3]
    return name.split()[0].split(".")[-1]


def py_spy(pid: int, output: str, *, gil: bool = False) -> subprocess.Popen[bytes]:
    """Sample the cluster (every process; idle threads too, or with ``gil`` only the threads
    that hold the GIL) until stopped: ``--profile out.svg`` (a flame graph) or ``out.txt``
    (collapsed stacks)."""
    kind = "raw" if output.endswith(".txt") else "flamegraph"
    beside = Path(sys.executable).with_name("py-spy")  # the venv's, when not on PATH
    spy = str(beside) if beside.exists() else "py-spy"
    command = [spy, "record", "--subprocesses", "--gil" if gil else "--idle", "-r", "200"]
    command += ["-f", kind]
    return subprocess.Popen(
        [*command, "-o", output, "-p", str(pid)],
        stdout=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lead", type=float, default=3.0)
    parser.add_argument("--profile", help="py-spy flame graph of the cluster (first run)")
    parser.add_argument(
        "--profile-gil", action="store_true", help="--profile samples only GIL holders"
    )
    parser.add_argument(
        "--count", type=int, default=0, help="then count the statements of a traced run"
    )
    args = parser.parse_args()
    setup()
    in_order = [
        run(
            args.hosts,
            args.workers,
            args.lead,
            args.profile if i == 0 else None,
            gil=args.profile_gil,
        )
        for i in range(args.runs)
    ]
    runs = sorted(in_order, key=lambda row: float(row[4]))
    rates = ", ".join(f"{float(row[4]):.0f}" for row in runs)
    table(
        f"Burst drain, {args.hosts} host lanes due at one instant, {args.workers} workers, "
        f"median of {args.runs} ({machine()})",
        [
            "hosts",
            "handler rows",
            "drained",
            "seconds",
            "hosts per second",
            "first pass ms",
            "pass start p50 ms",
            "pass to handler p50 ms",
            "handler row p50 ms",
            "handler row max ms",
            "all runs /s",
        ],
        [[*runs[len(runs) // 2][:10], rates]],
    )
    median = float(runs[len(runs) // 2][4])
    table(
        f"Burst drain, every run in the order run ({args.hosts} hosts)",
        [
            "run",
            "hosts per second",
            "of the median",
            "first pass ms",
            "handler row max ms",
            "the server meanwhile",
            "CPU ms a host: two busiest cluster processes",
            "other cluster processes",
            "PostgreSQL",
            "cores busy %",
        ],
        [
            [i + 1, row[4], float(row[4]) / median, row[5], row[9], row[10], *row[11:15]]
            for i, row in enumerate(in_order)
        ],
    )
    if args.count:
        row, texts = counted(args.count, args.workers, args.lead)
        table(
            f"Burst drain, what the database saw per drained host, one traced run of "
            f"{args.count} hosts ({machine()})",
            ["hosts", "drained", "statements", "commits", "health checks", "statements by span"],
            [row],
        )
        table(
            "The same run statement by statement: per drained host, the outermost span, the "
            f"statement's first {SHOWN} characters (or the commit, the health check)",
            ["per host", "span", "statement"],
            [[n, span, "`" + text.replace("|", "/") + "`"] for n, span, text in texts],
        )


if __name__ == "__main__":
    main()
