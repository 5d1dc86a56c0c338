"""The scenarios of ``python -m bench.peers``, run against one system at a time.

``lateness``, ``burst`` and ``immediate`` need the system's workers running; ``commit`` runs
with none.
Every timer must run exactly once: each scenario counts the timers that never ran, ran more
than once, or ran under a key it never armed, and returns those counts with its figures.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bench.common import percentile, wait_for
from bench.peers.systems import DurableAgent, System

SETTLE = 1.0  # seconds to wait after the last timer ran, for a late duplicate
BURST_PATIENCE = 300.0  # a slow system still drains a burst: give it time before counting


@dataclass
class Outcome:
    """What one scenario run measured, and what went wrong in it."""

    figures: dict[str, float] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)


def _keys(system: System, prefix: str, count: int) -> list[str]:
    if isinstance(system, DurableAgent):  # the timer is the host: its key is the task's key
        keys = [f"p-{i}" for i in range(count)]
        system.prepare(keys)
        return keys
    return [f"{prefix}-{i}" for i in range(count)]


def _arm_all(system: System, deadlines: dict[str, datetime], outcome: Outcome) -> None:
    """Arm every timer (in deadline order), then check that all were armed before the first
    deadline; learn the system's arming cost for the next lead."""
    from django.utils import timezone

    first = min(deadlines.values())
    started = time.perf_counter()
    for key, deadline in sorted(deadlines.items(), key=lambda item: item[1]):
        system.arm(key, deadline)
    system.arm_cost = (time.perf_counter() - started) / max(1, len(deadlines))
    late = (timezone.now() - first).total_seconds()
    if late > 0:
        outcome.notes.append(f"arming ended {late * 1000:.0f} ms after the first deadline")


def _lead(system: System, count: int) -> timedelta:
    return timedelta(seconds=2.0 + 2.0 * system.arm_cost * count)


def _collect(system: System, keys: list[str], outcome: Outcome) -> list[tuple[str, float, Any]]:
    from bench.peers.models import Run

    rows = list(Run.objects.filter(system=system.system).values_list("key", "started", "at"))
    seen = Counter(key for key, _, _ in rows)
    expected = set(keys)
    outcome.errors["missing"] += sum(1 for key in keys if not seen[key])
    outcome.errors["duplicate"] += sum(n - 1 for key, n in seen.items() if key in expected)
    outcome.errors["unknown key"] += sum(n for key, n in seen.items() if key not in expected)
    return rows


def _wait(system: System, count: int, timeout: float) -> None:
    from bench.peers.models import Run

    runs = Run.objects.filter(system=system.system)
    wait_for(lambda: runs.count() >= count, timeout=timeout, interval=0.2)
    time.sleep(SETTLE)


def _clear(system: System, outcome: Outcome) -> None:
    """Delete the system's rows; a row left here ran after its scenario was counted."""
    from bench.peers.models import Run

    late = Run.objects.filter(system=system.system).delete()[0]
    outcome.errors["ran after its scenario ended"] += late


def _done(system: System) -> None:
    """Delete the rows just counted."""
    from bench.peers.models import Run

    Run.objects.filter(system=system.system).delete()


def lateness(system: System, run: int, count: int, spread: float, patience: float) -> Outcome:
    """``count`` timers evenly over ``spread`` seconds: task start minus deadline (ms)."""
    from django.utils import timezone

    outcome = Outcome()
    _clear(system, outcome)
    keys = _keys(system, f"L{run}", count)
    start = timezone.now() + _lead(system, count)
    step = spread / max(1, count - 1)
    deadlines = {key: start + timedelta(seconds=i * step) for i, key in enumerate(keys)}
    _arm_all(system, deadlines, outcome)
    remaining = (start - timezone.now()).total_seconds() + spread
    _wait(system, count, timeout=max(0.0, remaining) + patience)
    rows = _collect(system, keys, outcome)
    first: dict[str, float] = {}
    for key, started, _ in sorted(rows, key=lambda row: row[1]):
        first.setdefault(key, started)
    values = [(first[key] - deadlines[key].timestamp()) * 1000 for key in keys if key in first]
    outcome.figures = {"p50": percentile(values, 50), "p99": percentile(values, 99)}
    _done(system)
    return outcome


def burst(system: System, run: int, count: int, patience: float) -> Outcome:
    """``count`` timers due at one instant: tasks per second from that instant to the last
    task's row written. The wait ends when all ran, or ``patience`` plus ``BURST_PATIENCE``
    seconds after the instant."""
    from django.utils import timezone

    outcome = Outcome()
    _clear(system, outcome)
    keys = _keys(system, f"B{run}", count)
    due = timezone.now() + _lead(system, count)
    _arm_all(system, dict.fromkeys(keys, due), outcome)
    remaining = (due - timezone.now()).total_seconds()
    _wait(system, count, timeout=max(0.0, remaining) + patience + BURST_PATIENCE)
    rows = _collect(system, keys, outcome)
    done = {key for key, _, _ in rows if key in set(keys)}
    if rows:
        last = max(at for _, _, at in rows)
        seconds = (last - due).total_seconds()
        outcome.figures = {"rate": len(done) / seconds, "seconds": seconds}
    _done(system)
    return outcome


def immediate(system: System, run: int, count: int, rate: float, patience: float) -> Outcome:
    """``count`` tasks for now, ``rate`` a second from this one client, each enqueued in its own
    committed transaction (``System.enqueue_now``): the task's first statement minus the moment
    the enqueue call returned (ms). durable_agent runs it twice: ``gate.schedule(host, lane,
    now)`` (figures ``p50``/``p99``) and ``durable_agent.submit()`` of a trivial agent
    (``submit p50``/``submit p99``), a host per call (the bench.immediate ``hosts`` scenario)."""
    outcome = Outcome()
    variants = ["lane", "submit"] if isinstance(system, DurableAgent) else ["task"]
    for variant in variants:
        _clear(system, outcome)
        keys = _keys(system, f"I{run}", count)
        returned: dict[str, float] = {}
        start = time.monotonic() + 0.05
        for i, key in enumerate(keys):
            pause = start + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            try:
                system.enqueue_now(key, variant)
            except Exception as exc:  # counted, never retried
                outcome.errors[f"enqueue raised {type(exc).__name__}"] += 1
                continue
            returned[key] = time.time()
        _wait(system, len(returned), timeout=patience)
        rows = _collect(system, keys, outcome)
        first: dict[str, float] = {}
        for key, started, _ in sorted(rows, key=lambda row: row[1]):
            first.setdefault(key, started)
        values = [(first[key] - at) * 1000 for key, at in returned.items() if key in first]
        prefix = "submit " if variant == "submit" else ""
        outcome.figures[f"{prefix}p50"] = percentile(values, 50)
        outcome.figures[f"{prefix}p99"] = percentile(values, 99)
        _done(system)
    return outcome


def commit(system: System, run: int, ops: int) -> Outcome:
    """p50 of a transaction that writes one row and schedules a wake-up, over the p50 of the
    same transaction without the wake-up (interleaved, so drift hits both alike)."""
    from django.db import transaction
    from django.utils import timezone

    from bench.peers.models import Write

    outcome = Outcome()
    warm = 20

    def bare(n: int) -> None:
        with transaction.atomic():
            Write.objects.create(system=system.system, n=n)

    def timed(fn: Any, *args: Any) -> float:
        started = time.perf_counter()
        fn(*args)
        return (time.perf_counter() - started) * 1000

    def measure(name: str, variant: Any, keys: list[str]) -> None:
        base: list[float] = []
        with_wake: list[float] = []
        for i, key in enumerate(keys):
            b = timed(bare, i)
            w = timed(variant, i, key)
            if i >= warm:
                base.append(b)
                with_wake.append(w)
        outcome.figures[f"{name} ratio"] = percentile(with_wake, 50) / percentile(base, 50)
        outcome.figures[f"{name} ms"] = percentile(with_wake, 50)
        outcome.figures.setdefault("bare ms", percentile(base, 50))

    hour = timezone.now() + timedelta(hours=1)
    if isinstance(system, DurableAgent):
        from bench.peers.tasks import LANE
        from durable_agent.maintenance import gate

        keys = [f"c{run}-{i}" for i in range(ops + warm)]
        system.prepare(keys)

        def gated(when: datetime) -> Any:
            def write(n: int, key: str) -> None:
                with gate.transaction(system.hosts[key]) as tx:
                    Write.objects.create(system=system.system, n=n)
                    tx.schedule(LANE, when)

            return write

        measure("new", gated(hour), keys)  # nothing pending: arms the slot
        measure("earlier", gated(hour - timedelta(minutes=30)), keys)  # moves it earlier
        measure("later", gated(hour + timedelta(hours=1)), keys)  # coalesces: no change
    else:

        def enqueued(n: int, key: str) -> None:
            with transaction.atomic():
                Write.objects.create(system=system.system, n=n)
                system.wake_up_in(key, hour)

        measure("new", enqueued, [f"c{run}-{i}" for i in range(ops + warm)])
    Write.objects.filter(system=system.system).delete()
    return outcome
