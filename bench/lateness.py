"""Alarm lateness on a live cluster: pass start minus the deadline the alarm fired for.

    python -m bench.lateness [--alarms 1000] [--spread 20] [--modes fast stock]

Each of ``--alarms`` hosts gets one alarm, due at an even spacing over ``--spread`` seconds,
through ``gate.schedule`` (a no-op host lane), all armed before the first is due. A
``manage.py qcluster`` subprocess with two workers fires them, with the fast path
(``AlarmBroker``) and with django-q's stock scheduler alone; the lateness of every pass
comes from its ``PassRecord``.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

from bench.common import cluster, machine, reset, setup, summary, table, wait_for


def prepare(count: int) -> list[int]:
    from durable_agent.maintenance import run_pass
    from durable_agent.models import Host, PassRecord

    hosts = Host.objects.bulk_create([Host(key=f"late-{i}") for i in range(count)])
    for host in hosts:  # the first-use pass, so each host is caught up before its alarm
        run_pass(host)
    PassRecord.objects.all().delete()
    return [h.pk for h in hosts]


def run(mode: str, count: int, spread: float) -> dict[str, float]:
    from django.utils import timezone

    from durable_agent.maintenance import gate
    from durable_agent.models import PassRecord

    reset()
    host_ids = prepare(count)
    with cluster(fast=mode == "fast"):
        time.sleep(4)  # let the cluster start before the first alarm is due
        # Every alarm is armed before the first one is due (arming takes ~10-20 ms each), so
        # the run measures firing, not a race between arming and firing.
        start = timezone.now() + timedelta(seconds=1 + 0.03 * count)
        step = spread / max(1, count - 1)
        for i, host_id in enumerate(host_ids):
            gate.schedule(host_id, "bench", start + timedelta(seconds=i * step))
        armed = timezone.now()
        if armed >= start:
            raise SystemExit(f"arming took too long: {armed - start} past the first deadline")
        patience = (start - armed).total_seconds() + spread + (40 if mode == "stock" else 10)
        wait_for(lambda: PassRecord.objects.count() >= count, timeout=patience, interval=0.5)
    lateness = list(
        PassRecord.objects.exclude(lateness_ms=None).values_list("lateness_ms", flat=True)
    )
    result = summary([float(v) for v in lateness])
    result["missing"] = count - len(lateness)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--alarms", type=int, default=1000)
    parser.add_argument("--spread", type=float, default=20.0)
    parser.add_argument("--modes", nargs="+", default=["fast", "stock"])
    args = parser.parse_args()
    setup()
    rows = []
    for mode in args.modes:
        s = run(mode, args.alarms, args.spread)
        label = "fast path (AlarmBroker)" if mode == "fast" else "stock scheduler only"
        rows.append([label, s["n"], s["missing"], s["p50"], s["p95"], s["p99"], s["max"]])
    table(
        f"Alarm lateness, {args.alarms} alarms over {args.spread:g} s, 2 workers ({machine()})",
        ["mode", "passes", "missing", "p50 ms", "p95 ms", "p99 ms", "max ms"],
        rows,
    )


if __name__ == "__main__":
    main()
