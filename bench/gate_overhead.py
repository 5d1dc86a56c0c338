"""Gate overhead: one source insert through gate.transaction vs a bare transaction.atomic vs
the same insert plus a django-q async_task in the same transaction.

    python -m bench.gate_overhead [--ops 2000]
"""

from __future__ import annotations

import argparse
import time

from bench.common import machine, reset, setup, summary, table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=2000)
    args = parser.parse_args()
    setup()
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext
    from django_q.tasks import async_task

    from bench.benchapp.models import Fact
    from durable_agent.maintenance import gate, run_pass
    from durable_agent.maintenance.lane_ids import NATIVE
    from durable_agent.models import Host

    reset()
    host = Host.objects.create(key="gate-bench")
    run_pass(host)  # settle the first-use pass: a steady host

    def bare() -> None:
        with transaction.atomic():
            Fact.objects.create(host=host, payload={"n": 1})

    def gated() -> None:
        with gate.transaction(host) as tx:
            Fact.objects.create(host=host, payload={"n": 1})
            tx.record_progress([NATIVE])

    def queued() -> None:
        with transaction.atomic():
            Fact.objects.create(host=host, payload={"n": 1})
            async_task("bench.benchapp.apps.noop", 1)

    variants = {"bare atomic": bare, "gate.transaction": gated, "atomic + async_task": queued}
    timings: dict[str, list[float]] = {name: [] for name in variants}
    queries: dict[str, int] = {}
    for name, fn in variants.items():  # warm up and count queries once
        with CaptureQueriesContext(connection) as captured:
            fn()
        queries[name] = len(captured)
    for _ in range(args.ops):  # interleave the variants so drift hits them alike
        for name, fn in variants.items():
            started = time.perf_counter()
            fn()
            timings[name].append((time.perf_counter() - started) * 1000)
    base = summary(timings["bare atomic"])
    rows = []
    for name in variants:
        s = summary(timings[name])
        rows.append(
            [
                name,
                s["n"],
                s["p50"],
                s["p99"],
                s["p50"] / base["p50"],
                queries[name],
                queries[name] - queries["bare atomic"],
            ]
        )
    table(
        f"Gate overhead ({args.ops} ops each; {machine()})",
        ["variant", "ops", "p50 ms", "p99 ms", "p50 / bare", "queries", "added queries"],
        rows,
    )


if __name__ == "__main__":
    main()
