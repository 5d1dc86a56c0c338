"""Gate overhead: one source insert through gate.transaction vs a bare transaction.atomic vs
the same insert plus a django-q async_task in the same transaction.

    python -m bench.gate_overhead [--ops 2000] [--sections]

``--sections`` also times, inside ``gate.transaction``, the alarm transaction and its four
statements (lock the state row, read the lanes with the host and slot, write the state, write
the lanes): p50 per operation.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import machine, reset, setup, summary, table

SECTIONS = {
    "run_alarm_transaction (all of it)": (
        "durable_agent.maintenance.transactions",
        "run_alarm_transaction",
    ),
    "lock the state row": ("durable_agent.maintenance.transactions", "lock_state"),
    "read lanes + host + slot": ("durable_agent.maintenance.due_queue", "DueQueue.load"),
    "write the state": ("durable_agent.maintenance.transactions", "_flush_state"),
    "write the lanes": ("durable_agent.maintenance.due_queue", "DueQueue.flush"),
}


def instrument() -> dict[str, list[float]]:
    """Wrap the alarm transaction's sections with timers; return where they accumulate."""
    import functools
    import importlib

    timings: dict[str, list[float]] = {}
    for label, (module_name, path) in SECTIONS.items():
        module = importlib.import_module(module_name)
        owner: Any = module
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        original = owner.__dict__[name]
        fn = original.__func__ if isinstance(original, classmethod) else original

        def timed(*args: Any, _fn: Any = fn, _label: str = label, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                timings.setdefault(_label, []).append((time.perf_counter() - started) * 1000)

        functools.update_wrapper(timed, fn)
        setattr(owner, name, classmethod(timed) if isinstance(original, classmethod) else timed)
    # gate.py imported run_alarm_transaction by name
    from durable_agent.maintenance import gate, transactions

    gate.run_alarm_transaction = transactions.run_alarm_transaction  # type: ignore[attr-defined]
    return timings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--sections", action="store_true")
    args = parser.parse_args()
    setup()
    sections = instrument() if args.sections else None
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
    if sections is not None:
        sections.clear()
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
    if sections is not None:
        table(
            "Inside gate.transaction: the alarm transaction and its statements",
            ["section", "calls", "p50 ms"],
            [[label, len(v), summary(v)["p50"]] for label, v in sections.items()],
        )


if __name__ == "__main__":
    main()
