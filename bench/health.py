"""``GET health`` (the audit of every host) at fleet sizes: time and queries.

    python -m bench.health [--sizes 1000 10000 100000] [--passes 3] [--repeat 3]

Every host has a state row, an armed slot, the native lane and ``--passes`` pass records;
one host in 100 is failing (its passes all failed), so the failure streak is computed over
real rows. The figure is ``audit_all(registry_key=...)``, the whole of ``GET health`` but the
JSON rendering.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

from bench.common import machine, reset, setup, summary, table

BATCH = 5000


def seed(count: int, passes: int) -> None:
    from django_q.models import Schedule

    from durable_agent import clock
    from durable_agent.models import DueLane, Host, MaintenanceState, PassRecord

    now = clock.now()
    for start in range(0, count, BATCH):
        keys = range(start, min(count, start + BATCH))
        schedules = Schedule.objects.bulk_create(
            [
                Schedule(
                    name=f"bench-health-{n}",
                    func="durable_agent.tasks.fire_alarm",
                    schedule_type=Schedule.ONCE,
                    repeats=1,
                    next_run=now + timedelta(minutes=5),
                )
                for n in keys
            ]
        )
        hosts = Host.objects.bulk_create(
            [
                Host(key=f"h{n:06d}", alarm=schedule, created_at=now)
                for n, schedule in zip(keys, schedules, strict=True)
            ]
        )
        MaintenanceState.objects.bulk_create(
            [MaintenanceState(host=h, dirty=2, processed=2, updated_at=now) for h in hosts]
        )
        DueLane.objects.bulk_create(
            [DueLane(host=h, lane="agent:native", due_at=None) for h in hosts]
        )
        PassRecord.objects.bulk_create(
            [
                PassRecord(
                    host=h,
                    started_at=now - timedelta(minutes=i),
                    phase="failed" if h.pk % 100 == 0 else "caught-up",
                    error="LaneNotRegistered: bench" if h.pk % 100 == 0 else "",
                )
                for h in hosts
                for i in range(passes)
            ]
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from durable_agent.maintenance.operators.audit import audit_all
    from durable_agent.runtime import get_runtime

    rows = []
    for size in args.sizes:
        reset()
        seed(size, args.passes)
        with connection.cursor() as cursor:  # settle the bulk load: no autovacuum mid-run
            cursor.execute("VACUUM ANALYZE")
        key = get_runtime().binding_registry_key()
        audit_all(registry_key=key)  # warm
        with CaptureQueriesContext(connection) as captured:
            result = audit_all(registry_key=key)
        timings = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            result = audit_all(registry_key=key)
            timings.append((time.perf_counter() - started) * 1000)
        s = summary(timings)
        rows.append([size, len(result.failing), len(captured), s["p50"], s["max"]])
    table(
        f"GET health: audit_all ({args.passes} pass records per host; {machine()})",
        ["hosts", "failing", "queries", "p50 ms", "max ms"],
        rows,
    )


if __name__ == "__main__":
    main()
