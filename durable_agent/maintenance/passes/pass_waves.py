"""The lane waves of a pass's general path, around its native step.

The concurrent waves admitted when the pass starts (``admit_waves``), the publication barrier
before the native step (``publication_barrier``), one more round for the lanes the native step
made due (``refill_waves``, Note [Deliver what the pass produced]) and the after-native waves
(``after_native``). How one wave runs is ``durable_agent/maintenance/passes/waves.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import Any

from durable_agent import clock, observability
from durable_agent.maintenance.lane_ids import PUBLICATION
from durable_agent.maintenance.mutations import gate
from durable_agent.maintenance.passes import lane_registry
from durable_agent.maintenance.passes.state import Pass
from durable_agent.maintenance.passes.waves import (
    admissible,
    join,
    run_wave,
    validate_lanes,
)
from durable_agent.maintenance.store.transactions import (
    AlarmTx,
    no_sooner_than_minimum,
    run_alarm_transaction,
)
from durable_agent.maintenance.types import Lane

#: A submitted wave: its lane, its future, its cancellation flag and its allowance in seconds.
Wave = tuple[str, Future[Any], threading.Event, float]


def publication_barrier(p: Pass) -> tuple[bool, datetime | None]:
    """Run a due publication wave before the native step (6.4 step 1).

    Returns (pending, the native lane's next time). While publication is still pending or
    parked, the native step waits, and the native lane's next time is the publication lane's
    deadline (no sooner than the minimum alarm delay; none while it is parked) rather than the
    minimum delay, so a pending publication is retried on its own backoff (1 s, 2 s, ... after
    each claim).
    """
    row = next((r for r in p.rows if r.lane == PUBLICATION), None)
    if row is None:
        return False, None
    spec = lane_registry.handler(PUBLICATION)
    if spec is not None and row.due_at is not None and row.due_at <= clock.now():
        run_wave(p, spec, row, threading.Event())
        row = next((Lane.from_model(r) for r in p.host.lanes.filter(lane=PUBLICATION)), row)
    if row.due_at is None and not row.parked:
        return False, None
    if row.parked or row.due_at is None:
        return True, None
    return True, no_sooner_than_minimum(row.due_at, clock.now())


def admit_waves(p: Pass, rows: list[Lane], producing: frozenset[str]) -> list[Wave]:
    """Submit a wave of every due lane of a phase that runs beside the native step."""
    now = clock.now()
    waves = []
    for row in admissible(rows, producing, now):
        spec = lane_registry.handler(row.lane)
        if spec is None or lane_registry.step_of(spec) != lane_registry.BESIDE_NATIVE:
            continue
        waves.append(_submit_wave(p, spec, row))
    return waves


# Note [Deliver what the pass produced]
#     Upstream's scheduling loop starts another wave of a concurrent lane whenever its last one
#     ended and the lane is due again, until the yield point. The port admits its concurrent
#     waves when the pass starts, so work the native step produced (the ``cleared`` recovery
#     event of a fault it just cleared, say) would wait for the next pass and keep the alarm
#     armed. So once the native step and the first waves have ended, every concurrent lane that
#     is due again gets one more wave, unless its first wave failed in this pass. One round:
#     a lane's claim sets a retry floor, so only new source progress makes it due again. Only
#     after a native step that ran: a caught-up pass produced nothing and keeps its constant
#     number of queries.


def refill_waves(p: Pass, done: list[Wave]) -> list[Wave]:
    """One more wave for each concurrent lane that became due while the native step ran
    (Note [Deliver what the pass produced])."""
    failed = {
        lane
        for lane, future, _, _ in done
        if not future.done() or future.cancelled() or future.exception() is not None
    }
    if clock.now() >= p.yield_at:
        return []
    rows = [Lane.from_model(r) for r in p.host.lanes.all()]
    rows = [r for r in rows if r.lane not in failed]
    return admit_waves(p, rows, frozenset(gate.active_lanes(p.host)))


def _submit_wave(
    p: Pass,
    spec: lane_registry.LaneSpec,
    row: Lane,
    *,
    after_native: bool = False,
    admitted: Callable[[], None] | None = None,
) -> Wave:
    assert p.executor is not None
    cancelled = threading.Event()
    future = p.executor.submit(
        observability.in_current_trace(
            lambda: run_wave(p, spec, row, cancelled, after_native=after_native, admitted=admitted)
        )
    )
    return row.lane, future, cancelled, spec.allowance_ms / 1000


def after_native(p: Pass) -> list[BaseException]:
    """After-native waves, round-robin from the lane after the last one admitted.

    They are bounded by ``dispatch_end`` alone, not by the yield point: they run after the
    native step even in a pass that reached its yield point. A lane is stored as the last one
    admitted only once its wave has claimed it, so a lane that did not run never moves the
    rotation on.
    """
    selected = [
        s for s in lane_registry.lanes() if lane_registry.step_of(s) == lane_registry.AFTER_NATIVE
    ]
    if not selected:
        return []
    rows = {r.lane: r for r in (Lane.from_model(x) for x in p.host.lanes.all())}
    producing = gate.active_lanes(p.host)
    validate_lanes(list(rows.values()))
    cursor = p.last_after_native_lane
    ordered = sorted(selected, key=lambda s: s.lane)
    index = next((i for i, s in enumerate(ordered) if cursor is None or s.lane > cursor), 0)
    rotated = ordered[index:] + ordered[:index]
    failures: list[BaseException] = []
    for spec in rotated:
        found = rows.get(spec.lane)
        now = clock.now()
        if found is None or found.due_at is None or found.due_at > now or spec.lane in producing:
            continue
        if now + timedelta(milliseconds=spec.allowance_ms) > p.dispatch_end:
            continue

        def admit(lane: str = spec.lane) -> None:
            def fn(tx: AlarmTx) -> None:
                tx.state.last_after_native_lane = lane

            run_alarm_transaction(p.host, "admit after-native wave", fn)
            p.last_after_native_lane = lane

        wave = _submit_wave(p, spec, found, after_native=True, admitted=admit)
        failures += join([wave])
    return failures
