"""Gate overhead: a commit with wake-up through gate.transaction vs a bare transaction.atomic.

    python -m bench.gate_overhead [--ops 2000] [--runs 3] [--sections]
                                  [--ablate notify-trigger list-indexes]

Every variant writes one source row (a ``Fact``) in its own transaction. The gated variants
also record native progress (``tx.record_progress([NATIVE])``: the host must be woken), in
the cases that decide what the alarm transaction writes to the slot:

- **new host**: a host's first wake-up: its state row, native lane and slot are created
  (a fresh host per operation, created outside the timing);
- **settled host**: nothing pending, the slot disarmed (as a finished pass leaves it; reset
  outside the timing): the slot is armed;
- **earlier**: the slot holds a later time (the lanes' next deadline in an hour; reset outside
  the timing): the slot moves earlier;
- **coalesces**: the slot already holds an earlier time: nothing to move.

Each case runs on PostgreSQL through the commit function (Note [The commit function] in
``durable_agent/migrations/sql/0015_commit_intent.sql``) and, for comparison in the same
minute, through the Python path (``run_alarm_transaction``). The variants are interleaved.
``--runs`` repeats the whole measurement and reports the median of the runs' percentiles.
"statements" counts what Django sends, BEGIN and COMMIT included: one round trip each.

A second table times the first commit on a new connection (as a process with
``CONN_MAX_AGE=0`` makes every request), where PostgreSQL compiles the function first.

``--sections`` also times the alarm transaction's parts per case: the commit function's one
call, or run_alarm_transaction and its four statements (lock the state row, read the lanes
with the host and slot, write the state, write the lanes): p50 per operation.

``--ablate`` measures what a part of the schema costs a commit by removing it from the bench
database before the runs (never do this to a real one): ``notify-trigger`` disables the
trigger of migration ``0009`` (the ``NOTIFY`` sent when a slot is armed soon),
``list-indexes`` drops the partial indexes of migration ``0011`` (the host lists' filters).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from bench.common import machine, reset, setup, summary, table

SECTIONS = {
    "commit function (one call)": ("durable_agent.maintenance.mutations.commit_function", "commit"),
    "run_alarm_transaction (all of it)": (
        "durable_agent.maintenance.store.transactions",
        "run_alarm_transaction",
    ),
    "lock the state row": ("durable_agent.maintenance.store.transactions", "lock_state"),
    "read lanes + host + slot": ("durable_agent.maintenance.store.due_queue", "DueQueue.load"),
    "write the state": ("durable_agent.maintenance.store.transactions", "_flush_state"),
    "write the lanes": ("durable_agent.maintenance.store.due_queue", "DueQueue.flush"),
}
CASES = ("new host", "settled host", "earlier", "coalesces")
PATHS = ("function", "python")
NEW = "new connection:"
ABLATIONS = {
    "notify-trigger": ["ALTER TABLE django_q_schedule DISABLE TRIGGER da_schedule_notify"],
    "list-indexes": [
        f"DROP INDEX {name}"
        for name in (
            "da_state_dirty",
            "da_duelane_parked",
            "da_host_single_thread",
            "da_pass_failed",
        )
    ],
}


def instrument(current: list[str]) -> dict[str, dict[str, list[float]]]:
    """Wrap the alarm transaction's sections with timers, per variant (``current[0]``)."""
    import functools
    import importlib

    timings: dict[str, dict[str, list[float]]] = {}
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
                elapsed = (time.perf_counter() - started) * 1000
                timings.setdefault(current[0], {}).setdefault(_label, []).append(elapsed)

        functools.update_wrapper(timed, fn)
        setattr(owner, name, classmethod(timed) if isinstance(original, classmethod) else timed)
    # gate.py imported run_alarm_transaction by name
    from durable_agent.maintenance import gate, transactions

    gate.run_alarm_transaction = transactions.run_alarm_transaction  # type: ignore[attr-defined]
    return timings


Variant = tuple[Callable[[], None], Callable[[], None]]  # (prepare, untimed; operation, timed)


def variants() -> dict[str, Variant]:
    from django.db import transaction
    from django.db.models import F
    from django_q.models import Schedule
    from django_q.tasks import async_task

    from bench.benchapp.models import Fact
    from durable_agent import clock
    from durable_agent.maintenance import commit_function, gate, run_pass
    from durable_agent.maintenance.lane_ids import NATIVE
    from durable_agent.models import DueLane, Host, LaneState, MaintenanceState

    keys = iter(range(10**9))
    steady = Host.objects.create(key="gate-bench")
    run_pass(steady)  # settle the first-use pass: a steady host

    def nothing() -> None:
        pass

    def bare() -> None:
        with transaction.atomic():
            Fact.objects.create(host=steady, payload={"n": 1})

    def queued() -> None:
        with transaction.atomic():
            Fact.objects.create(host=steady, payload={"n": 1})
            async_task("bench.benchapp.apps.noop", 1)

    found: dict[str, Variant] = {"bare atomic": (nothing, bare)}

    for path in PATHS:
        for case in CASES:
            host = Host.objects.create(key=f"gate-bench-{case.replace(' ', '-')}-{path}")
            run_pass(host)
            target = [host]

            def wake(target: list[Host] = target, path: str = path) -> None:
                commit_function.enabled = path == "function"
                with gate.transaction(target[0]) as tx:
                    Fact.objects.create(host=target[0], payload={"n": 1})
                    tx.record_progress([NATIVE])

            def fresh(target: list[Host] = target) -> None:
                target[0] = Host.objects.create(key=f"gate-bench-new-{next(keys)}")

            def settle(target: list[Host] = target) -> None:
                host = target[0]
                MaintenanceState.objects.filter(host=host).update(processed=F("dirty"))
                DueLane.objects.filter(host=host).update(due_at=None, state=LaneState.IDLE)
                Schedule.objects.filter(durable_agent_host=host).update(repeats=0)

            def later(target: list[Host] = target) -> None:
                host = target[0]
                in_an_hour = clock.now() + timedelta(hours=1)
                DueLane.objects.filter(host=host).update(due_at=in_an_hour)
                Schedule.objects.filter(durable_agent_host=host).update(
                    next_run=in_an_hour, repeats=1
                )

            prepare = {
                "new host": fresh,
                "settled host": settle,
                "earlier": later,
                "coalesces": nothing,
            }[case]
            found[f"gate.transaction, {case}, {path}"] = (prepare, wake)
    found["atomic + async_task"] = (nothing, queued)

    def reconnect() -> None:
        from django.db import connection

        connection.close()  # the next statement opens a new connection (inside the timing)

    coalesced = found["gate.transaction, coalesces, function"][1]
    python_coalesced = found["gate.transaction, coalesces, python"][1]
    found[f"{NEW} bare atomic"] = (reconnect, bare)
    found[f"{NEW} gate.transaction, coalesces, function"] = (reconnect, coalesced)
    found[f"{NEW} gate.transaction, coalesces, python"] = (reconnect, python_coalesced)
    return found


def measure(ops: int, sections: bool) -> tuple[dict[str, dict[str, float]], dict[str, int], Any]:
    """One run: p50/p99 per variant, statements per variant, section timings."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from durable_agent.maintenance import commit_function

    current = ["-"]
    timed_sections = instrument(current) if sections else None
    reset()
    found = variants()
    timings: dict[str, list[float]] = {name: [] for name in found}
    statements: dict[str, int] = {}
    for name, (prepare, fn) in found.items():  # warm up and count statements once
        prepare()
        with CaptureQueriesContext(connection) as captured:
            fn()
        statements[name] = len(captured)
    if timed_sections is not None:
        timed_sections.clear()
    for _ in range(ops):  # interleave the variants so drift hits them alike
        for name, (prepare, fn) in found.items():
            prepare()
            current[0] = name
            started = time.perf_counter()
            fn()
            timings[name].append((time.perf_counter() - started) * 1000)
            current[0] = "-"
    commit_function.enabled = True
    results = {name: summary(values) for name, values in timings.items()}
    return results, statements, timed_sections


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sections", action="store_true")
    parser.add_argument("--ablate", nargs="+", default=[], choices=sorted(ABLATIONS))
    args = parser.parse_args()
    setup()
    if args.ablate:
        from django.db import connection

        with connection.cursor() as cursor:
            for part in args.ablate:
                for statement in ABLATIONS[part]:
                    cursor.execute(statement)
    runs = []
    for index in range(args.runs):  # sections are timed in the first run only
        runs.append(measure(args.ops, args.sections and index == 0))
    statements = runs[0][1]
    names = list(runs[0][0])

    def median(name: str, key: str) -> float:
        return statistics.median(run[0][name][key] for run in runs)

    def rows(selected: list[str], base_name: str) -> list[list[Any]]:
        base = median(base_name, "p50")
        return [
            [
                name.removeprefix(NEW).strip(),
                args.ops,
                median(name, "p50"),
                median(name, "p99"),
                median(name, "p50") / base,
                statements[name],
                statements[name] - statements[base_name],
            ]
            for name in selected
        ]

    headers = ["variant", "ops", "p50 ms", "p99 ms", "p50 / bare", "statements", "added"]
    table(
        f"Gate overhead ({args.ops} ops each, median of {args.runs} runs"
        f"{', without ' + ' and '.join(args.ablate) if args.ablate else ''}; {machine()})",
        headers,
        rows([n for n in names if not n.startswith(NEW)], "bare atomic"),
    )
    table(
        "The first commit on a new connection (connecting included)",
        headers,
        rows([n for n in names if n.startswith(NEW)], f"{NEW} bare atomic"),
    )
    sections = runs[0][2]
    if sections:
        table(
            "Inside gate.transaction: the alarm transaction and its statements (first run)",
            ["variant", "section", "calls", "p50 ms"],
            [
                [variant, label, len(v), summary(v)["p50"]]
                for variant, by_label in sections.items()
                if variant != "-"
                for label, v in by_label.items()
            ],
        )


if __name__ == "__main__":
    main()
