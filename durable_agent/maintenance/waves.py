"""Lane waves: charge an attempt, run the handler outside every lock, complete or back off.

Note [Charge before fallible work]
    A wave claims its lane (one stall, a retry floor, the slot re-armed to the earliest lane)
    in its own transaction *before* the handler runs. A crash inside the handler therefore
    leaves the lane due at its floor with an armed slot; the completion is a compare-and-set on
    the revision the wave saw, so a producer that raced it keeps its newer revision due.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import connections

from durable_agent import clock, conf, observability
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
    """Runs one pass's attempts and waves: inline with one worker, else on a thread pool.

    Note [One pool per calling thread]
        The pool outlives the pass: it belongs to the thread that runs passes (a django-q
        worker's main thread, a test's thread), so its threads and their database connections
        are reused from pass to pass instead of opened per wave (a new PostgreSQL connection
        costs more than a whole caught-up pass). A pool thread keeps its connection as
        ``CONN_MAX_AGE`` allows, like any request thread. Concurrent passes in other threads
        get their own pools, so one pass's waves never queue behind another's. A pass that
        leaves work running on the pool (an overrun wave) retires it: the next pass gets fresh
        threads, and the retired ones close their connections when their work returns.
    """

    def __init__(self, workers: int) -> None:
        self._pool = _thread_pool(workers) if workers > 1 else None
        self._futures: list[Future[Any]] = []

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        if self._pool is None:
            future: Future[T] = Future()
            try:
                future.set_result(fn())
            except BaseException as exc:  # delivered through the future, like a thread's
                future.set_exception(exc)
            return future
        pool = self._pool

        def run() -> T:
            try:
                return fn()
            finally:
                _release_connections(retired=pool.retired)

        submitted = pool.executor.submit(run)
        self._futures.append(submitted)
        return submitted

    def shutdown(self) -> None:
        """Cancel this pass's queued work; retire the pool if any of it is still running."""
        if self._pool is None:
            return
        running = [f for f in self._futures if not f.cancel() and not f.done()]
        if running:
            _retire(self._pool)


@dataclass
class _Pool:
    executor: ThreadPoolExecutor
    workers: int
    pid: int
    retired: threading.Event = field(default_factory=threading.Event)


_pools = threading.local()


def _thread_pool(workers: int) -> _Pool:
    """The calling thread's pool of ``workers`` threads (see Note [One pool per calling
    thread]); a new one after a fork, a retirement or a change of ``PASS_WORKERS``."""
    pool: _Pool | None = getattr(_pools, "pool", None)
    if pool is None or pool.retired.is_set() or pool.workers != workers or pool.pid != os.getpid():
        pool = _Pool(ThreadPoolExecutor(workers, "da-pass"), workers, os.getpid())
        _pools.pool = pool
    return pool


def _retire(pool: _Pool) -> None:
    pool.retired.set()
    pool.executor.shutdown(wait=False, cancel_futures=True)


def _release_connections(*, retired: threading.Event) -> None:
    """After a pool thread's work: close its connections when its pool is retired, else only
    those that are broken or past ``CONN_MAX_AGE`` (Django's own request-end rule)."""
    if retired.is_set():
        connections.close_all()
        return
    for connection in connections.all(initialized_only=True):
        connection.close_if_unusable_or_obsolete()


def close_thread_pool() -> None:
    """Stop the calling thread's pool and close its threads' database connections.

    For the end of a process or a test session (a connection left open blocks dropping the
    test database); passes never need it.
    """
    pool: _Pool | None = getattr(_pools, "pool", None)
    if pool is None:
        return
    _pools.pool = None
    running = not pool.retired.is_set()  # a retired pool's executor is already shut down
    pool.retired.set()
    if running and pool.pid == os.getpid():
        barrier = threading.Barrier(pool.workers)

        def close() -> None:  # one per thread: each waits until every thread holds one
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=5)
            _close_runner()
            connections.close_all()

        for _ in range(pool.workers):
            pool.executor.submit(close)
    pool.executor.shutdown(wait=True)
    _close_runner()


_runners = threading.local()


class RecoveryTimeout(TimeoutError):
    """A recovery read of the runtime did not return within ``RECOVERY_TIMEOUT_MS``; the pass
    abandoned it. Never leaves the pass: the thread gets a recovery fault instead."""

    def __init__(self, message: str, *, operation: str, timeout_ms: int) -> None:
        super().__init__(message)
        self.operation = operation
        self.timeout_ms = timeout_ms


def bounded_call(operation: str, fn: Callable[[], T]) -> T:
    """Run the runtime call ``fn`` of a pass, bounded by ``RECOVERY_TIMEOUT_MS`` (6.4, 6.6).

    Note [A hung runtime call is abandoned]
        With a pool (``PASS_WORKERS`` above 1) the call runs on the calling thread's runner:
        one more thread, with its own database connection, reused from call to call like the
        pool's. Past the timeout the pass stops waiting and raises :class:`RecoveryTimeout`;
        the runner is retired (the next call gets a fresh one) and closes its connections
        when the abandoned call returns. Nothing the call returns is used: the pass writes no
        cursor, report or fault from it. The call's own writes are the runtime's recovery
        transactions, each deciding from the rows it locks, so a late commit is a recovery
        racing the next pass, which the runtime must already tolerate. Inline passes
        (``PASS_WORKERS=1``) run the call in the calling thread, unbounded.
    """
    if conf.pass_workers() <= 1:
        with gate.native_source():
            return fn()
    timeout = conf.recovery_timeout()
    runner: _Pool | None = getattr(_runners, "runner", None)
    if runner is None or runner.retired.is_set() or runner.pid != os.getpid():
        runner = _Pool(ThreadPoolExecutor(1, "da-runtime"), 1, os.getpid())
        _runners.runner = runner
    retired = runner.retired

    def run() -> T:
        try:
            with gate.native_source():
                return fn()
        finally:
            _release_connections(retired=retired)

    future = runner.executor.submit(run)
    try:
        return future.result(timeout=timeout.total_seconds())
    except FutureTimeout:
        _retire(runner)
        raise RecoveryTimeout(
            f"{operation} did not return within {_ms(timeout)} ms; the pass abandoned it",
            operation=operation,
            timeout_ms=_ms(timeout),
        ) from None


def _ms(delta: timedelta) -> int:
    return int(delta / timedelta(milliseconds=1))


def _close_runner() -> None:
    """Stop the calling thread's runner (see :func:`bounded_call`) and close its connection."""
    runner: _Pool | None = getattr(_runners, "runner", None)
    if runner is None:
        return
    _runners.runner = None
    if runner.retired.is_set() or runner.pid != os.getpid():
        return  # its abandoned call closes the connection when it returns
    runner.retired.set()
    runner.executor.submit(connections.close_all)
    runner.executor.shutdown(wait=True)


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
        return charge_in(state, queue, checkpoint, row, now)

    claimed = run_alarm_transaction(host, "charge maintenance attempt", charge)
    if claimed is None:
        return False, None
    observe_claim(observed, claimed)
    outcome, failure = run_claimed(row.lane, work, now, allowance)
    complete_wave(host, claimed, outcome, failure, observed)
    if failure is not None:
        raise failure
    return True, outcome


def charge_in(
    state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint, row: Lane, now: datetime
) -> Lane | None:
    """Claim ``row`` and arm the slot within the lease, inside an alarm transaction (Note
    [Charge before fallible work]); None when the lane moved or is not due."""
    claimed = queue.claim(row, now)
    arm_within_lease(state, queue, checkpoint, now)
    return claimed


def observe_claim(observed: Observation, claimed: Lane) -> None:
    """Remember a committed claim (``rearm_failure`` must not charge the lane twice)."""
    with observed.lock:
        observed.charged[claimed.lane] = claimed.revision
        observed.queue[claimed.lane] = claimed
        observed.available[claimed.lane] = claimed.revision


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
    host: Host,
    claimed: Lane,
    outcome: datetime | None,
    failure: BaseException | None,
    observed: Observation,
) -> None:
    """Complete a claimed wave in its own alarm transaction (backing it off after a failure)."""
    jitter = clock.random()

    def complete(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> int | None:
        return complete_in(queue, claimed, outcome, failure, gate.active_lanes(host), jitter)

    revision = run_alarm_transaction(host, "complete maintenance wave", complete)
    if revision is not None:
        with observed.lock:
            observed.available[claimed.lane] = revision


def arm_within_lease(
    state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint, now: datetime
) -> None:
    """Arm the slot at the earliest lane deadline, but while a pass lease is live no later than
    its expiry: a pass that dies mid-way is retried within the lease TTL (docs/pass.md)."""
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
    *,
    admitted: Callable[[], None] | None = None,
) -> tuple[bool, datetime | None]:
    """Admit one wave of ``spec`` if it fits before ``dispatch_end``, then run it.

    ``admitted`` runs once the lane is claimed, before its handler: only a wave that really
    runs is recorded as admitted (the after-native rotation cursor).
    """
    now = clock.now()
    allowance = timedelta(milliseconds=spec.allowance_ms)
    if now >= until or now + allowance > dispatch_end:
        return False, row.due_at  # not admitted: no claim, no debit
    context = LaneContext(host=host, lane=spec.lane, deadline=now + allowance, _cancelled=cancelled)

    def work() -> datetime | None:
        if admitted is not None:
            admitted()
        return spec.run(context)

    with observability.span(
        "durable_agent.wave", host_key=host.key, host_id=host.pk, lane=row.lane
    ):
        return run_queued(host, row, work, observed, allowance=allowance)


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
