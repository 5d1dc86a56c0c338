"""Alarm lateness on a live cluster: at the lane handler's start, and at the pass start.

    python -m bench.lateness [--runs 3] [--broker orm redis] [--modes listen probe stock]
                             [--rates 25 200] [--seconds 8] [--now 50]

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


def handler_lateness(directory: str, deadlines: dict[int, float]) -> list[float]:
    """Milliseconds from each host's lane deadline to its handler's (first) start."""
    starts: dict[int, float] = {}
    for path in Path(directory).glob("*.log"):
        for line in path.read_text().splitlines():
            host, started = line.split()[:2]
            starts[int(host)] = min(float(started), starts.get(int(host), float("inf")))
    return [(starts[h] - deadlines[h]) * 1000 for h in starts if h in deadlines]


def run(broker: str, mode: str, scenario: str, *, rate: float, count: int) -> dict[str, Any]:
    from django.utils import timezone

    from durable_agent.maintenance import gate
    from durable_agent.models import PassRecord

    reset()
    host_ids = prepare(count)
    records = tempfile.mkdtemp(prefix="bench-late-")
    broker_class = mode[6:] if mode.startswith("class:") else BROKERS[broker, mode]
    env = {"Q_BROKER_CLASS": broker_class, "BENCH_HANDLER_DIR": records}
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
        for host_id, deadline in (
            PassRecord.objects.exclude(deadline=None)
            .order_by("-started_at")
            .values_list("host_id", "deadline")
        ):
            deadlines[host_id] = deadline.timestamp()
        handlers = handler_lateness(records, deadlines)
    finally:
        shutil.rmtree(records, ignore_errors=True)
    return {
        "handler": summary(handlers),
        "pass": summary(passes),
        "missing": count - len(handlers),
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
    args = parser.parse_args()
    setup()
    scenarios = [(f"{r:g}/s", "rate", r, round(r * args.seconds)) for r in args.rates]
    if args.now:
        scenarios.append(("armed for now", "now", 5.0, args.now))
    rows = []
    for broker in args.broker:
        for mode in args.modes:
            if (broker, mode) not in BROKERS and not mode.startswith("class:"):
                continue
            for label, scenario, rate, count in scenarios:
                results = [
                    run(broker, mode, scenario, rate=rate, count=count) for _ in range(args.runs)
                ]
                rows.append(
                    [
                        broker,
                        mode,
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


if __name__ == "__main__":
    main()
