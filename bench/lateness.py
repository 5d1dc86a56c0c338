"""Alarm lateness on a live cluster: at the lane handler's start, and at the pass start.

    python -m bench.lateness [--runs 3] [--broker orm redis] [--modes listen probe stock]
                             [--rates 25 200] [--seconds 8] [--now 50] [--stages]
                             [--fire-ahead-ms 0 10]

Scenarios, each on a fresh set of hosts and a fresh ``manage.py qcluster`` (two workers):

- ``<rate>/s``: ``rate * seconds`` alarms due at an even spacing (``rate`` per second), all armed
  through ``gate.schedule`` (the ``bench-clock`` lane) before the first is due;
- ``armed for now``: ``--now`` alarms, each armed for the current time by the driver while the
  cluster runs, about 5 per second (so the workers are idle when each fires).

The handler of the ``bench-clock`` lane (``bench/benchapp/lanes.py``) records the clock when it
starts: its lateness is that time minus the deadline the host's alarm fired for (a slot armed
for "now" holds the gate's minimum delay, 50 ms ahead), so it covers the broker, the
scheduler, the hand-over to a worker and the pass up to the handler. ``PassRecord.lateness_ms``
is the pass start minus the alarm's deadline. Modes: ``listen`` is ``AlarmBroker`` (or
``AlarmRedisBroker``) as shipped; ``probe`` the same without its LISTEN wake-up (the 0.1 s
probe alone, as on SQLite); ``stock`` django-q's scheduler alone (ORM only; ~30 s scans, slow);
``class:<dotted path>`` any other broker class.
``--stages`` splits the lateness at the stages an alarm goes through: "fired" is the task's
enqueue (django-q's ``Task.started``, which ``async_task`` sets when the firing builds the
task) minus the deadline; "fired to pass" is the pass start minus the enqueue (the hand-over
to a worker and the delivery up to the pass); "pass to handler" is the handler's start minus
the pass start (the pass's first transaction). It makes the cluster keep every task result
(``save_limit`` 0), which costs its monitor one insert per task.
``--fire-ahead-ms`` runs every scenario with each given ``FIRE_AHEAD_MS`` (Note [Fire ahead,
run at the deadline] in ``durable_agent/broker.py``; 0 fires at the deadline), the runs of the
values interleaved so that a change in the machine's load hits them alike; by default the
setting's default.
Each cell is the median over ``--runs`` runs. ``--broker redis`` needs a Redis at
``REDIS_URL`` (default ``redis://127.0.0.1:6379/7``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import cluster, machine, reset, setup, summary, table, wait_for

LANE = "bench-clock"
BROKERS = {
    ("orm", "listen"): "durable_agent.broker.AlarmBroker",
    ("orm", "probe"): "bench.brokers.ProbeOnlyAlarmBroker",
    ("orm", "stock"): "",
    ("redis", "listen"): "durable_agent.redis_broker.AlarmRedisBroker",
    ("redis", "probe"): "bench.redis_brokers.ProbeOnlyAlarmRedisBroker",
}


def prepare(count: int) -> list[int]:
    from durable_agent.maintenance import run_pass
    from durable_agent.models import Host, PassRecord

    hosts = Host.objects.bulk_create([Host(key=f"late-{i}") for i in range(count)])
    for host in hosts:  # the first-use pass, so each host is caught up before its alarm
        run_pass(host)
    PassRecord.objects.all().delete()
    return [h.pk for h in hosts]


def handler_starts(directory: str) -> dict[int, float]:
    """Each host's handler's (first) start, in epoch seconds."""
    starts: dict[int, float] = {}
    for path in Path(directory).glob("*.log"):
        for line in path.read_text().splitlines():
            host, started = line.split()[:2]
            starts[int(host)] = min(float(started), starts.get(int(host), float("inf")))
    return starts


def handler_lateness(directory: str, deadlines: dict[int, float]) -> list[float]:
    """Milliseconds from each host's lane deadline to its handler's (first) start."""
    starts = handler_starts(directory)
    return [(starts[h] - deadlines[h]) * 1000 for h in starts if h in deadlines]


def stage_lateness(
    deadlines: dict[int, float], passes: dict[int, float], handlers: dict[int, float]
) -> dict[str, list[float]]:
    """Milliseconds per stage for each host whose alarm task was kept (``--stages``)."""
    from django_q.models import Task

    from durable_agent import conf

    fired: dict[int, float] = {}
    for args, started in Task.objects.filter(func=conf.alarm_task()).values_list("args", "started"):
        host = int(args[0])
        fired[host] = min(started.timestamp(), fired.get(host, float("inf")))
    hosts = [h for h in fired if h in deadlines and h in passes and h in handlers]
    return {
        "fired": [(fired[h] - deadlines[h]) * 1000 for h in hosts],
        "fired to pass": [(passes[h] - fired[h]) * 1000 for h in hosts],
        "pass to handler": [(handlers[h] - passes[h]) * 1000 for h in hosts],
    }


def run(
    broker: str,
    mode: str,
    scenario: str,
    *,
    rate: float,
    count: int,
    stages: bool = False,
    fire_ahead_ms: int | None = None,
) -> dict[str, Any]:
    from django.utils import timezone

    from durable_agent.maintenance import gate
    from durable_agent.models import PassRecord

    reset()
    host_ids = prepare(count)
    records = tempfile.mkdtemp(prefix="bench-late-")
    broker_class = mode[6:] if mode.startswith("class:") else BROKERS[broker, mode]
    env = {"Q_BROKER_CLASS": broker_class, "BENCH_HANDLER_DIR": records}
    if stages:
        env["Q_SAVE_LIMIT"] = "0"
    if fire_ahead_ms is not None:
        env["DA_FIRE_AHEAD_MS"] = str(fire_ahead_ms)
    if broker == "redis":
        env["Q_REDIS"] = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/7")
        env["Q_NAME"] = "bench_lateness"  # its own keys on a shared Redis
    try:
        with cluster(env=env):
            time.sleep(4)  # let the cluster start before the first alarm is due
            if scenario == "now":
                for host_id in host_ids:
                    gate.schedule(host_id, LANE, timezone.now())
                    time.sleep(0.2)
                span = 0.0
            else:
                # Every alarm is armed before the first one is due, so the run measures
                # firing, not a race between arming and firing.
                start = timezone.now() + timedelta(seconds=1 + 0.02 * count)
                step = 1 / rate
                for i, host_id in enumerate(host_ids):
                    gate.schedule(host_id, LANE, start + timedelta(seconds=i * step))
                armed = timezone.now()
                if armed >= start:
                    raise SystemExit(f"arming took too long: {armed - start} past the first")
                span = (start - armed).total_seconds() + count * step
            patience = span + (45 if mode == "stock" else 15)
            wait_for(lambda: PassRecord.objects.count() >= count, timeout=patience, interval=0.5)
        passes = [
            float(v)
            for v in PassRecord.objects.exclude(lateness_ms=None).values_list(
                "lateness_ms", flat=True
            )
        ]
        deadlines: dict[int, float] = {}  # the deadline each host's first alarm fired for
        pass_starts: dict[int, float] = {}  # and the start of the pass it delivered
        for host_id, deadline, started in (
            PassRecord.objects.exclude(deadline=None)
            .order_by("-started_at")
            .values_list("host_id", "deadline", "started_at")
        ):
            deadlines[host_id] = deadline.timestamp()
            pass_starts[host_id] = started.timestamp()
        handlers = handler_lateness(records, deadlines)
        by_stage = stage_lateness(deadlines, pass_starts, handler_starts(records)) if stages else {}
    finally:
        shutil.rmtree(records, ignore_errors=True)
    return {
        "handler": summary(handlers),
        "pass": summary(passes),
        "missing": count - len(handlers),
        "stages": {name: summary(values) for name, values in by_stage.items()},
    }


def median_of(results: list[dict[str, Any]], part: str, key: str) -> float:
    return statistics.median(r[part][key] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--broker", nargs="+", default=["orm"], choices=["orm", "redis"])
    parser.add_argument("--modes", nargs="+", default=["listen", "probe"])
    parser.add_argument("--rates", nargs="+", type=float, default=[25.0, 200.0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--now", type=int, default=50, help="alarms armed for now (0: none)")
    parser.add_argument("--stages", action="store_true", help="lateness by stage, see above")
    parser.add_argument("--fire-ahead-ms", nargs="+", type=int, default=[None])
    args = parser.parse_args()
    setup()
    scenarios = [(f"{r:g}/s", "rate", r, round(r * args.seconds)) for r in args.rates]
    if args.now:
        scenarios.append(("armed for now", "now", 5.0, args.now))
    rows: list[list[Any]] = []
    stage_rows: list[list[Any]] = []
    for broker in args.broker:
        for mode in args.modes:
            if (broker, mode) not in BROKERS and not mode.startswith("class:"):
                continue
            for label, scenario, rate, count in scenarios:
                by_ahead: dict[int | None, list[dict[str, Any]]] = {
                    ahead: [] for ahead in args.fire_ahead_ms
                }
                for _ in range(args.runs):  # the values interleaved, run by run
                    for ahead in args.fire_ahead_ms:
                        by_ahead[ahead].append(
                            run(
                                broker,
                                mode,
                                scenario,
                                rate=rate,
                                count=count,
                                stages=args.stages,
                                fire_ahead_ms=ahead,
                            )
                        )
                for ahead, results in by_ahead.items():
                    shown = "default" if ahead is None else ahead
                    for stage in results[0]["stages"]:
                        stage_rows.append(
                            [
                                broker,
                                mode,
                                shown,
                                label,
                                stage,
                                median_of([r["stages"] for r in results], stage, "p50"),
                                median_of([r["stages"] for r in results], stage, "p99"),
                            ]
                        )
                    rows.append(
                        [
                            broker,
                            mode,
                            shown,
                            label,
                            count,
                            max(r["missing"] for r in results),
                            median_of(results, "handler", "p50"),
                            median_of(results, "handler", "p99"),
                            median_of(results, "handler", "max"),
                            median_of(results, "pass", "p50"),
                            median_of(results, "pass", "p99"),
                        ]
                    )
    table(
        f"Alarm lateness, median of {args.runs} runs, 2 workers ({machine()})",
        [
            "broker",
            "mode",
            "fire ahead ms",
            "scenario",
            "alarms",
            "missing",
            "handler p50 ms",
            "handler p99 ms",
            "handler max ms",
            "pass p50 ms",
            "pass p99 ms",
        ],
        rows,
    )
    if stage_rows:
        table(
            f"Lateness by stage, median of {args.runs} runs (save_limit 0)",
            ["broker", "mode", "fire ahead ms", "scenario", "stage", "p50 ms", "p99 ms"],
            stage_rows,
        )


if __name__ == "__main__":
    main()
