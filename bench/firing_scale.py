"""Scale of firing: the cost of firing 100 due alarms with 1 000 vs 100 000 armed hosts.

    python -m bench.firing_scale [--armed 1000 100000] [--due 100] [--rounds 5]

Measures one django-q scheduler scan (the one the fast path calls) that enqueues the due
slots, and the fast-path probe query on its own.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

from bench.common import machine, reset, setup, summary, table


def arm(count: int, *, due: bool, start: int) -> list[int]:
    from django.utils import timezone
    from django_q.models import Schedule

    from durable_agent.models import Host

    when = timezone.now() + (timedelta(seconds=-1) if due else timedelta(days=1))
    hosts = Host.objects.bulk_create([Host(key=f"h{start + i}") for i in range(count)])
    schedules = Schedule.objects.bulk_create(
        [
            Schedule(
                name=f"durable_agent:host:{h.pk}",
                func="durable_agent.tasks.fire_alarm",
                args=repr(h.pk),
                schedule_type=Schedule.ONCE,
                repeats=1,
                next_run=when,
                intended_date_kwarg="deadline",
            )
            for h in hosts
        ],
        batch_size=5000,
    )
    for h, s in zip(hosts, schedules, strict=True):
        h.alarm_id = s.pk
    Host.objects.bulk_update(hosts, ["alarm"], batch_size=5000)
    return [s.pk for s in schedules]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--armed", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--due", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    setup()
    from django.db import connection
    from django.utils import timezone
    from django_q.brokers import get_broker
    from django_q.models import OrmQ, Schedule
    from django_q.scheduler import scheduler

    from durable_agent.broker import next_armed_run

    rows = []
    for armed in args.armed:
        reset()
        arm(armed, due=False, start=0)
        due_ids = arm(args.due, due=True, start=armed)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        broker = get_broker()
        scans, probes = [], []
        for _ in range(args.rounds):
            Schedule.objects.filter(pk__in=due_ids).update(
                repeats=1, next_run=timezone.now() - timedelta(seconds=1)
            )
            OrmQ.objects.all().delete()
            started = time.perf_counter()
            first = next_armed_run()
            probes.append((time.perf_counter() - started) * 1000)
            assert first is not None
            assert first <= timezone.now()
            started = time.perf_counter()
            scheduler(broker=broker)
            scans.append((time.perf_counter() - started) * 1000)
            assert OrmQ.objects.count() == args.due
        scan, probe = summary(scans), summary(probes)
        rows.append([armed, args.due, scan["p50"], scan["max"], probe["p50"]])
    base = rows[0][2]
    for row in rows:
        row.append(row[2] / base)
    table(
        f"Firing {args.due} due alarms ({args.rounds} rounds; {machine()})",
        ["armed hosts", "due", "scan p50 ms", "scan max ms", "probe p50 ms", "scan / first"],
        rows,
    )


if __name__ == "__main__":
    main()
