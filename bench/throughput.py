"""Throughput: hosts due at once, drained by a live 2-worker cluster (passes per second).

    python -m bench.throughput [--hosts 1000] [--scenarios wave idle] [--repeat 3]

Each scenario runs ``--repeat`` times; the row with the median rate is printed (a run lasts a
few seconds, so single runs vary by about 20 %). ``Q_BULK`` (django-q's ``bulk``; the example
settings' 4 by default) and ``BENCH_HEALTH_CHECKS=0`` (no ``CONN_HEALTH_CHECKS``) change the
cluster's settings.

Two scenarios, each with ``--hosts`` hosts caught up by their first-use pass:

``wave``
    Every host has one due host-lane wave (a no-op handler), so each delivery runs a whole
    pass: lease + begin, the wave (charge + complete), finish, record. Measured from the
    first pass's start to the last pass's finish (``PassRecord``).
``idle``
    Every host's slot is armed and due while the host has nothing due (as after a repair or a
    duplicate delivery): each delivery is one guarded transaction that finds nothing to do and
    disarms the slot. Measured end to end: from the moment all slots come due (one
    ``UPDATE`` of their ``Schedule`` rows, the cluster already running) until no slot is
    armed and the broker queue is empty; django-q's scheduler firing them is included.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from typing import Any

from bench.common import cluster, machine, reset, setup, table, wait_for


def wave(hosts: int, workers: int) -> list[Any]:
    from django.db.models import Max, Min
    from django.utils import timezone

    from bench.lateness import prepare
    from durable_agent.maintenance import gate
    from durable_agent.models import PassRecord

    reset()
    host_ids = prepare(hosts)
    now = timezone.now()
    for host_id in host_ids:
        gate.schedule(host_id, "bench", now)
    with cluster(fast=True, workers=workers):
        done = wait_for(lambda: PassRecord.objects.count() >= hosts, timeout=300, interval=0.5)
    span = PassRecord.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    passes = PassRecord.objects.count()
    seconds = (span["last"] - span["first"]).total_seconds() if passes else float("nan")
    label = "one due no-op lane wave (first pass start to last pass finish)"
    return [label, hosts, passes, "yes" if done else "no", seconds, passes / seconds]


def idle(hosts: int, workers: int) -> list[Any]:
    from django.utils import timezone
    from django_q.models import OrmQ, Schedule

    from bench.lateness import prepare
    from durable_agent.models import Host

    reset()
    prepare(hosts)
    slots = list(Host.objects.exclude(alarm=None).values_list("alarm_id", flat=True))
    assert len(slots) == hosts, "every host keeps its slot after its first pass"

    def drained() -> bool:
        armed = Schedule.objects.filter(pk__in=slots).exclude(repeats=0).exists()
        return not armed and not OrmQ.objects.exists()

    with cluster(fast=True, workers=workers):
        time.sleep(4)  # let the cluster start
        due = timezone.now()
        Schedule.objects.filter(pk__in=slots).update(
            next_run=due - timedelta(milliseconds=1), repeats=1
        )
        started = time.perf_counter()
        done = wait_for(drained, timeout=300, interval=0.02)
        seconds = time.perf_counter() - started
    label = "slot due, nothing due (slot due to queue drained)"
    return [label, hosts, hosts, "yes" if done else "no", seconds, hosts / seconds]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scenarios", nargs="+", default=["wave", "idle"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    setup()
    scenarios = {"wave": wave, "idle": idle}
    rows = []
    for name in args.scenarios:
        runs = sorted(
            (scenarios[name](args.hosts, args.workers) for _ in range(args.repeat)),
            key=lambda row: float(row[-1]),
        )
        rates = ", ".join(f"{float(row[-1]):.0f}" for row in runs)
        rows.append([*runs[len(runs) // 2], rates])
    table(
        f"Throughput, {args.hosts} hosts due at once, {args.workers} workers, "
        f"median of {args.repeat} ({machine()})",
        ["scenario", "hosts", "deliveries", "drained", "seconds", "per second", "all runs /s"],
        rows,
    )


if __name__ == "__main__":
    main()
