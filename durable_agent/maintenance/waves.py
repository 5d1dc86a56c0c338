"""Lane waves: charge an attempt, run the handler outside every lock, complete or back off (6.8).

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
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import connections

from durable_agent import clock, conf
from durable_agent.errors import AlarmError, LaneNotRegistered
from durable_agent.maintenance import backoff, gate
from durable_agent.maintenance.alarm import Checkpoint
from durable_agent.maintenance.due_queue import DueQueue, Lane
from durable_agent.maintenance.lane_ids import NATIVE, PUBLICATION
from durable_agent.maintenance.lane_registry import LaneContext, LaneSpec, handler
from durable_agent.maintenance.transactions import run_alarm_transaction
from durable_agent.models import Host, MaintenanceState

logger = logging.getLogger("durable_agent.maintenance")
T = TypeVar("T")
ALLOWANCE_MESSAGE = "The admitted host wave exceeded its allowance; durable work remains pending"


@dataclass
class Observation:
    """What a pass observed: acknowledged only if nothing newer arrived (6.1, 6.11)."""

    generation: int | None = None
    native_only: bool = False
    queue: dict[str, Lane] = field(default_factory=dict)
    charged: dict[str, int] = field(default_factory=dict)
    available: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Executor:
    """Runs attempts and waves: inline with one worker, else in a small thread pool."""

    def __init__(self, workers: int) -> None:
        self._pool = ThreadPoolExecutor(workers, "da-pass") if workers > 1 else None

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        if self._pool is None:
            future: Future[T] = Future()
            try:
                future.set_result(fn())
            except BaseException as exc:  # delivered through the future, like a thread's
                future.set_exception(exc)
            return future

        def run() -> T:
            try:
                return fn()
            finally:
                connections.close_all()

        return self._pool.submit(run)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def validate_lanes(rows: list[Lane]) -> None:
    """Every due row needs a handler (the native lane is the pass itself)."""
    for row in rows:
        if row.due_at is not None and row.lane != NATIVE and handler(row.lane) is None:
            raise LaneNotRegistered(
                f"No handler registered for scheduled lane: {row.lane}", lane=row.lane
            )


def run_queued(
    host: Host,
    row: Lane,
    work: Callable[[], datetime | None],
    observed: Observation,
    *,
    allowance: timedelta | None = None,
) -> tuple[bool, datetime | None]:
    """Charge ``row``, run ``work`` and complete the lane; return (ran, next deadline).

    A failing or overrunning wave is completed with backoff and its error re-raised.
    """
    now = clock.now()

    def charge(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> Lane | None:
        claimed = queue.claim(row, now)
        arm_within_lease(state, queue, checkpoint, now)
        return claimed

    claimed = run_alarm_transaction(host, "charge maintenance attempt", charge)
    if claimed is None:
        return False, None
    with observed.lock:
        observed.charged[row.lane] = claimed.revision
        observed.queue[row.lane] = claimed
        observed.available[row.lane] = claimed.revision
    failure: BaseException | None = None
    outcome: datetime | None = None
    try:
        outcome = work()
        if allowance is not None and clock.now() - now > allowance:
            raise AlarmError("host dispatch allowance", ALLOWANCE_MESSAGE, lane=row.lane)
    except BaseException as exc:
        failure = exc
    jitter = clock.random()

    def complete(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> int | None:
        if row.lane in gate.active_lanes(host):
            return None  # a producer between enrollment and commit: never acknowledge
        current = queue.find(row.lane)
        if current is None or current.revision != claimed.revision:
            return None  # a racing producer keeps its newer revision due
        later = clock.now()
        due = (
            later + timedelta(milliseconds=backoff.backoff_delay_ms(claimed.stalls, jitter))
            if failure is not None
            else outcome
        )
        done = queue.complete(claimed, due)
        return None if done is None else done.revision

    revision = run_alarm_transaction(host, "complete maintenance wave", complete)
    if revision is not None:
        with observed.lock:
            observed.available[row.lane] = revision
    if failure is not None:
        raise failure
    return True, outcome


def arm_within_lease(
    state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint, now: datetime
) -> None:
    """Arm the slot at the earliest lane deadline, but while a pass lease is live no later than
    its expiry: a pass that dies mid-way is retried within the lease TTL (DESIGN P12)."""
    earliest = queue.next()
    target = None if earliest is None else max(now + conf.minimum_alarm_delay(), earliest)
    lease_end = state.pass_lease_expires_at
    if state.pass_lease_owner and lease_end is not None and lease_end > now:
        target = lease_end if target is None else min(target, lease_end)
    if target is None:
        checkpoint.cancel()
    else:
        checkpoint.at(target)


def run_wave(
    host: Host,
    spec: LaneSpec,
    row: Lane,
    observed: Observation,
    until: datetime,
    dispatch_end: datetime,
    cancelled: threading.Event,
) -> tuple[bool, datetime | None]:
    """Admit one wave of ``spec`` if it fits before ``dispatch_end``, then run it."""
    now = clock.now()
    allowance = timedelta(milliseconds=spec.allowance_ms)
    if now >= until or now + allowance > dispatch_end:
        return False, row.due_at  # not admitted: no claim, no debit
    context = LaneContext(host=host, lane=spec.lane, deadline=now + allowance, _cancelled=cancelled)
    return run_queued(host, row, lambda: spec.run(context), observed, allowance=allowance)


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
