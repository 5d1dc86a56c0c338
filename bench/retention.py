"""Retention: table sizes under steady load with short retention settings stay flat.

    python -m bench.retention [--seconds 180] [--hosts 50] [--rate 10] [--retention-ms 30000]
                              [--sweep-ms 5000] [--batch 500] [--sample 15] [--no-retention]
    python -m bench.retention --backlog 20000 [--batch 500]

A live 2-worker cluster (with ``AlarmBroker``, so the sweep runs every ``--sweep-ms``) runs for
``--seconds`` while this process, at ``--rate`` operations per second over ``--hosts`` hosts:

- schedules a due no-op lane wave on the next host (one pass: a ``PassRecord``, and a django-q
  ``Task`` row, since the cluster runs with ``save_limit=0`` here: every result kept);
- every fifth operation also rearms that host (an ``AlarmAudit`` row), appends one recovery
  event through the maintenance transaction (the cluster's recovery-events lane delivers it),
  and inserts a ``MutationTicket`` that expired two hours ago (a crashed mutation's leftover).

Every ``--sample`` seconds it counts the rows of each table. With the retention settings at
``--retention-ms`` the counts level off at about ``rate x (retention + sweep interval)``; with
``--no-retention`` (every retention ``None``) the same load shows them growing. Expired tickets
are pruned after a fixed hour of grace whatever the settings, so they stay flat either way.

``--backlog N`` instead measures what one retention run costs: it loads ``N`` expired rows into
each table (as after an upgrade), then calls ``retention.prune()`` until they are gone and
reports the time of each call (one batch per table, each in its own transaction).
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from typing import Any

from bench.common import cluster, machine, reset, setup, table

TABLES = ("PassRecord", "AlarmAudit", "RecoveryEvent", "MutationTicket", "Task", "OrmQ")


def counts() -> dict[str, int]:
    from django_q.models import OrmQ, Task

    from durable_agent.models import AlarmAudit, MutationTicket, PassRecord, RecoveryEvent

    models: dict[str, Any] = {
        "PassRecord": PassRecord,
        "AlarmAudit": AlarmAudit,
        "RecoveryEvent": RecoveryEvent,
        "MutationTicket": MutationTicket,
        "Task": Task,
        "OrmQ": OrmQ,
    }
    return {name: model.objects.count() for name, model in models.items()}


def append_event(host_id: int) -> None:
    from durable_agent import clock
    from durable_agent.maintenance.passes.recovery import append_recovery_events
    from durable_agent.maintenance.store.transactions import run_alarm_transaction
    from durable_agent.models import RecoveryEvent

    now = clock.now()
    event = RecoveryEvent(
        host_id=host_id,
        transition="created",
        thread="bench",
        submission="bench",
        occurred_at=now,
        first_failed_at=now,
        failure={"phase": "recovery", "reason": "bench"},
    )
    run_alarm_transaction(
        host_id, "bench recovery event", lambda tx: append_recovery_events(tx, [event])
    )


def run(args: argparse.Namespace) -> list[list[Any]]:
    from django.utils import timezone

    from bench.lateness import prepare
    from durable_agent.maintenance import alarm, gate
    from durable_agent.models import MutationTicket

    reset()
    host_ids = prepare(args.hosts)
    rows: list[list[Any]] = []
    operations = 0
    with cluster(fast=True, workers=2):
        time.sleep(4)  # let the cluster start (and run its first sweep)
        start = time.monotonic()
        next_sample = start
        while True:
            elapsed = time.monotonic() - start
            if elapsed >= next_sample - start:
                rows.append([round(elapsed), operations, *counts().values()])
                next_sample += args.sample
            if elapsed >= args.seconds:
                break
            host_id = host_ids[operations % len(host_ids)]
            now = timezone.now()
            gate.schedule(host_id, "bench", now)
            if operations % 5 == 0:
                alarm.rearm(host_id, actor="bench", reason="retention bench")
                append_event(host_id)
                MutationTicket.objects.create(
                    host_id=host_id,
                    created_at=now - timedelta(hours=3),
                    expires_at=now - timedelta(hours=2),
                )
            operations += 1
            pause = start + operations / args.rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
    return rows


def backlog(count: int) -> list[list[Any]]:
    from django.utils import timezone
    from django_q.models import Task

    from bench.common import summary
    from durable_agent.maintenance import retention
    from durable_agent.models import (
        AlarmAudit,
        Host,
        MaintenanceState,
        MutationTicket,
        PassRecord,
        RecoveryEvent,
    )

    reset()
    now = timezone.now()
    old = now - timedelta(days=400)
    hosts = Host.objects.bulk_create([Host(key=f"backlog-{i}") for i in range(100)])
    per_host = count // len(hosts)
    MaintenanceState.objects.bulk_create(
        MaintenanceState(
            host=h, recovery_event_sequence=per_host, recovery_event_acknowledged=per_host
        )
        for h in hosts
    )
    for h in hosts:
        at = [old + timedelta(seconds=i) for i in range(per_host)]
        PassRecord.objects.bulk_create(
            PassRecord(host=h, started_at=t, phase="caught-up") for t in at
        )
        PassRecord.objects.create(host=h, started_at=now, phase="caught-up")
        AlarmAudit.objects.bulk_create(
            AlarmAudit(host=h, actor="bench", generation=1, at=t) for t in at
        )
        RecoveryEvent.objects.bulk_create(
            RecoveryEvent(
                host=h,
                sequence=i + 1,
                transition="created",
                thread="bench",
                submission="bench",
                occurred_at=t,
                first_failed_at=t,
                delivered_at=t,
            )
            for i, t in enumerate(at)
        )
        MutationTicket.objects.bulk_create(
            MutationTicket(host=h, created_at=t, expires_at=t + timedelta(minutes=1)) for t in at
        )
        Task.objects.bulk_create(
            Task(
                id=f"{h.pk}-{i}",
                name=f"{h.pk}-{i}",
                func="durable_agent.tasks.fire_alarm",
                started=t,
                stopped=t,
                success=True,
            )
            for i, t in enumerate(at)
        )
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    loaded = counts()
    times: list[float] = []
    while True:
        started = time.perf_counter()
        pruned = retention.prune()
        times.append((time.perf_counter() - started) * 1000)
        if not any(pruned.values()):
            times.pop()  # the empty run that ends the loop
            break
    left = counts()
    stats = summary(times)
    return [
        [
            per_host * len(hosts),
            sum(v for k, v in loaded.items() if k != "OrmQ") - sum(left.values()),
            len(times),
            stats["p50"],
            stats["max"],
            sum(left.values()),
        ]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=180)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--retention-ms", type=int, default=30_000)
    parser.add_argument("--sweep-ms", type=int, default=5_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--sample", type=int, default=15)
    parser.add_argument("--no-retention", action="store_true")
    parser.add_argument("--backlog", type=int, default=0)
    args = parser.parse_args()
    # Read by bench/settings.py, in this process and in the cluster's.
    os.environ["DA_RETENTION_MS"] = "none" if args.no_retention else str(args.retention_ms)
    os.environ["DA_SWEEP_MS"] = str(args.sweep_ms)
    os.environ["DA_RETENTION_BATCH"] = str(args.batch)
    os.environ["Q_SAVE_LIMIT"] = "0"
    setup()
    print(machine())
    if args.backlog:
        table(
            f"retention.prune() draining a backlog, batch {args.batch} per table per call",
            ["rows per table", "rows deleted", "calls", "p50 ms per call", "max ms", "rows left"],
            backlog(args.backlog),
        )
        return
    rows = run(args)
    retention = "off" if args.no_retention else f"{args.retention_ms} ms"
    table(
        f"Row counts under {args.rate:g} operations/s over {args.hosts} hosts, retention "
        f"{retention}, sweep every {args.sweep_ms} ms, batch {args.batch}",
        ["t (s)", "operations", *TABLES],
        rows,
    )


if __name__ == "__main__":
    main()
