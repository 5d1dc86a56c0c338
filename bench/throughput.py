"""Throughput: hosts due at once, drained by a live 2-worker cluster (passes per second).

    python -m bench.throughput [--hosts 1000]

Every host has one due host-lane wave (a no-op), so each pass is a real alarm-driven pass
with nothing else to do: fire, lease + begin, wave (charge + complete), finish, record.
"""

from __future__ import annotations

import argparse

from bench.common import cluster, machine, reset, setup, table, wait_for


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    setup()
    from django.db.models import Max, Min
    from django.utils import timezone

    from bench.lateness import prepare
    from durable_agent.maintenance import gate
    from durable_agent.models import PassRecord

    reset()
    host_ids = prepare(args.hosts)
    now = timezone.now()
    for host_id in host_ids:
        gate.schedule(host_id, "bench", now)
    with cluster(fast=True, workers=args.workers):
        done = wait_for(lambda: PassRecord.objects.count() >= args.hosts, timeout=300, interval=0.5)
    span = PassRecord.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    passes = PassRecord.objects.count()
    seconds = (span["last"] - span["first"]).total_seconds() if passes else float("nan")
    table(
        f"Throughput, {args.hosts} hosts due at once, {args.workers} workers ({machine()})",
        ["hosts", "passes", "drained", "seconds (first start to last finish)", "passes/s"],
        [[args.hosts, passes, "yes" if done else "no", seconds, passes / seconds]],
    )


if __name__ == "__main__":
    main()
