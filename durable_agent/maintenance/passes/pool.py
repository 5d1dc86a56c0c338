"""The pass's threads: one pool per calling thread for its waves and attempts, and a runner
that bounds the pass's runtime calls (Note [One pool per calling thread], Note [A hung runtime
call is abandoned]).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from django.db import connections

from durable_agent import conf
from durable_agent.maintenance.mutations import gate

T = TypeVar("T")


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
