"""``GET health`` (the audit of every host) at fleet sizes: time and queries.

    python -m bench.health [--sizes 1000 10000 100000] [--passes 3] [--repeat 3]
    python -m bench.health --unhealthy 20000 [--repeat 3]


Every host has a state row, an armed slot, the native lane and ``--passes`` pass records;
one host in 100 is failing (its passes all failed), so the failure streak is computed over
real rows. The figure is ``audit_all(registry_key=...)``, the whole of ``GET health`` but the
JSON rendering.

``--unhealthy N``: N hosts that all violate the invariant (dirty, no slot), are failing (3
failed passes with a 5 000-character error) and hold 3 parked lanes each, the fleet of an
incident. The figures are ``GET health``'s answer built and rendered (its view but the token
check), the same answer from the full audit (how ``GET health`` built it before it counted
the unhealthy hosts), and the full audit ``maintenance_audit`` reads.
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


def seed_unhealthy(count: int) -> None:
    from durable_agent import clock
    from durable_agent.models import DueLane, Host, MaintenanceState, PassRecord

    now = clock.now()
    for start in range(0, count, BATCH):
        hosts = Host.objects.bulk_create(
            [
                Host(key=f"sick-{n:06d}", created_at=now)
                for n in range(start, min(count, start + BATCH))
            ]
        )
        MaintenanceState.objects.bulk_create(
            [MaintenanceState(host=h, dirty=2, processed=1, updated_at=now) for h in hosts]
        )
        DueLane.objects.bulk_create(
            [
                DueLane(host=h, lane=f"lane-{n}", state="parked", stalls=8)
                for h in hosts
                for n in range(3)
            ]
        )
        PassRecord.objects.bulk_create(
            [
                PassRecord(
                    host=h, started_at=now - timedelta(minutes=i), phase="failed", error="E" * 5000
                )
                for h in hosts
                for i in range(3)
            ]
        )


def unhealthy(count: int, repeat: int) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from durable_agent.api.hosts import HEALTH_LISTED, _bounded_health
    from durable_agent.maintenance.operators.audit import audit_all
    from durable_agent.runtime import get_runtime

    reset()
    seed_unhealthy(count)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    key = get_runtime().binding_registry_key()
    ways = {
        "GET health (listed)": lambda: _bounded_health(
            audit_all(registry_key=key, listed=HEALTH_LISTED)
        ).model_dump_json(),
        "GET health as before (the full audit)": lambda: _bounded_health(
            audit_all(registry_key=key)
        ).model_dump_json(),
        "full audit (maintenance_audit)": lambda: audit_all(registry_key=key),
    }
    rows = []
    for name, run in ways.items():
        run()  # warm
        with CaptureQueriesContext(connection) as captured:
            run()
        timings = []
        for _ in range(repeat):
            started = time.perf_counter()
            run()
            timings.append((time.perf_counter() - started) * 1000)
        s = summary(timings)
        rows.append([name, count, len(captured), s["p50"], s["max"]])
    table(
        f"GET health with every host unhealthy ({machine()})",
        ["what", "unhealthy hosts", "queries", "p50 ms", "max ms"],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--unhealthy", type=int, default=0, help="only the unhealthy fleet")
    args = parser.parse_args()
    setup()
    if args.unhealthy:
        unhealthy(args.unhealthy, args.repeat)
        return
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
