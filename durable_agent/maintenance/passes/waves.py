"""Lane waves: charge an attempt, run the handler outside every lock, complete or back off.

Note [Charge before fallible work]
    A wave claims its lane (one stall, a retry floor, the slot re-armed to the earliest lane)
    in its own transaction *before* the handler runs. A crash inside the handler therefore
    leaves the lane due at its floor with an armed slot; the completion is a compare-and-set on
    the revision the wave saw, so a producer that raced it keeps its newer revision due.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timedelta
from typing import Any

from durable_agent import clock, observability
from durable_agent.errors import AlarmError, LaneNotRegistered
from durable_agent.maintenance import backoff
from durable_agent.maintenance.lane_ids import NATIVE, PUBLICATION
from durable_agent.maintenance.passes.lane_registry import LaneSpec, handler, step_of
from durable_agent.maintenance.passes.state import Pass
from durable_agent.maintenance.store.due_queue import DueQueue
from durable_agent.maintenance.store.transactions import AlarmTx, run_alarm_transaction
from durable_agent.maintenance.types import Lane, LaneContext

logger = logging.getLogger("durable_agent.maintenance")
ALLOWANCE_MESSAGE = "The admitted host wave exceeded its allowance; durable work remains pending"


class OverrunFlag(threading.Event):
    """The cancellation flag of a wave the pass runs on its own thread: set by hand, or by
    itself once the clock passes ``limit`` (when a pass running its waves on the pool stops
    waiting for one, see :func:`join`), so ``ctx.cancelled()`` means the same either way."""

    def __init__(self, limit: datetime) -> None:
        super().__init__()
        self._limit = limit

    def is_set(self) -> bool:
        return super().is_set() or clock.now() >= self._limit


def validate_lanes(rows: list[Lane]) -> None:
    """Every due row needs a handler (the native lane is the pass itself) of a phase a step of
    the pass runs (Note [Lane phases] in ``lane_registry.py``)."""
    for row in rows:
        if row.due_at is None or row.lane == NATIVE:
            continue
        spec = handler(row.lane)
        if spec is None:
            raise LaneNotRegistered(
                f"No handler registered for scheduled lane: {row.lane}", lane=row.lane
            )
        if step_of(spec) is None:
            raise LaneNotRegistered(
                f"No step of the pass runs phase {spec.phase!r} of scheduled lane: {row.lane}",
                lane=row.lane,
            )


def run_queued(
    p: Pass,
    row: Lane,
    work: Callable[[], datetime | None],
    *,
    allowance: timedelta | None = None,
) -> tuple[bool, datetime | None]:
    """Charge ``row``, run ``work`` and complete the lane; return (ran, next deadline).

    A failing or overrunning wave is completed with backoff and its error re-raised.
    """
    now = clock.now()

    def charge(tx: AlarmTx) -> Lane | None:
        return charge_in(tx, row, now)

    claimed = run_alarm_transaction(p.host, "charge maintenance attempt", charge)
    if claimed is None:
        return False, None
    p.claimed(claimed)
    outcome, failure = run_claimed(row.lane, work, now, allowance)
    complete_wave(p, claimed, outcome, failure)
    if failure is not None:
        raise failure
    return True, outcome


def charge_in(tx: AlarmTx, row: Lane, now: datetime) -> Lane | None:
    """Claim ``row`` and arm the slot within the lease, inside an alarm transaction (Note
    [Charge before fallible work]); None when the lane moved or is not due."""
    claimed = tx.queue.claim(row, now)
    tx.arm_within_lease(now)
    return claimed


def run_claimed(
    lane: str, work: Callable[[], datetime | None], started: datetime, allowance: timedelta | None
) -> tuple[datetime | None, BaseException | None]:
    """Run a claimed wave's ``work`` outside every lock: (its next deadline, its failure)."""
    try:
        outcome = work()
        if allowance is not None and clock.now() - started > allowance:
            raise AlarmError("host dispatch allowance", ALLOWANCE_MESSAGE, lane=lane)
    except BaseException as exc:
        return None, exc
    return outcome, None


def complete_in(
    queue: DueQueue,
    claimed: Lane,
    outcome: datetime | None,
    failure: BaseException | None,
    producing: frozenset[str],
    jitter: float,
) -> int | None:
    """Complete a claimed wave inside an alarm transaction: its revision afterwards, or None
    when a producer raced it (a live ticket enrolls the lane, or the revision moved)."""
    if claimed.lane in producing:
        return None  # a producer between enrollment and commit: never acknowledge
    current = queue.find(claimed.lane)
    if current is None or current.revision != claimed.revision:
        return None  # a racing producer keeps its newer revision due
    due = (
        clock.now() + timedelta(milliseconds=backoff.backoff_delay_ms(claimed.stalls, jitter))
        if failure is not None
        else outcome
    )
    done = queue.complete(claimed, due)
    return None if done is None else done.revision


def complete_wave(
    p: Pass, claimed: Lane, outcome: datetime | None, failure: BaseException | None
) -> None:
    """Complete a claimed wave in its own alarm transaction (backing it off after a failure)."""
    jitter = clock.random()

    def complete(tx: AlarmTx) -> int | None:
        producing = tx.producing_lanes(clock.now())[1]
        return complete_in(tx.queue, claimed, outcome, failure, producing, jitter)

    run_alarm_transaction(p.host, "complete maintenance wave", complete)


def run_wave(
    p: Pass,
    spec: LaneSpec,
    row: Lane,
    cancelled: threading.Event,
    *,
    after_native: bool = False,
    admitted: Callable[[], None] | None = None,
) -> tuple[bool, datetime | None]:
    """Admit one wave of ``spec`` if it fits before the pass's ``dispatch_end`` (and, beside
    the native step, before its ``yield_at``), then run it.

    ``admitted`` runs once the lane is claimed, before its handler: only a wave that really
    runs is recorded as admitted (the after-native rotation cursor).
    """
    now = clock.now()
    allowance = timedelta(milliseconds=spec.allowance_ms)
    until = p.dispatch_end if after_native else p.yield_at
    if now >= until or now + allowance > p.dispatch_end:
        return False, row.due_at  # not admitted: no claim, no debit
    context = LaneContext(
        host=p.host, lane=spec.lane, deadline=now + allowance, _cancelled=cancelled
    )

    def work() -> datetime | None:
        if admitted is not None:
            admitted()
        return spec.run(context)

    with observability.span(
        "durable_agent.wave", host_key=p.host.key, host_id=p.host.pk, lane=row.lane
    ):
        return run_queued(p, row, work, allowance=allowance)


def join(
    futures: list[tuple[str, Future[Any], threading.Event, float]],
) -> list[BaseException]:
    """Wait for every wave; an overrun cancels it and counts as its failure."""
    failures: list[BaseException] = []
    for lane, future, cancelled, allowance_s in futures:
        try:
            future.result(timeout=allowance_s + 1)
        except FutureTimeout:
            cancelled.set()
            failures.append(AlarmError("host dispatch allowance", ALLOWANCE_MESSAGE, lane=lane))
        except BaseException as exc:
            failures.append(exc)
    return failures


def admissible(rows: list[Lane], producing: frozenset[str], now: datetime) -> list[Lane]:
    """Rows a wave may run for now: due, not being produced, not the native barrier lanes."""
    return [
        row
        for row in rows
        if row.lane not in (NATIVE, PUBLICATION)
        and row.lane not in producing
        and row.due_at is not None
        and row.due_at <= now
    ]
