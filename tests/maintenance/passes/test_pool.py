"""The pass's thread pool: kept per calling thread, its connections reused (Note [One pool per
calling thread] in durable_agent/maintenance/passes/pool.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.db import connection, connections

from durable_agent.maintenance.passes import pool as thread_pools
from durable_agent.maintenance.passes.pool import Executor, close_thread_pool

pytestmark = [pytest.mark.threads, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _fresh_pool() -> Iterator[None]:
    close_thread_pool()
    yield
    close_thread_pool()


def _where() -> tuple[int, int]:
    """The running thread and the identity of its live database connection."""
    connection.ensure_connection()
    return threading.get_ident(), id(connection.connection)


def _run(executor: Executor) -> tuple[int, int]:
    try:
        return executor.submit(_where).result(timeout=10)
    finally:
        executor.shutdown()


def test_pool__passes_on_one_thread_reuse_threads_and_connections() -> None:
    connection.settings_dict["CONN_MAX_AGE"] = None
    try:
        first = _run(Executor(2))
        second = _run(Executor(2))
    finally:
        connection.settings_dict["CONN_MAX_AGE"] = 0
    assert first[0] != threading.get_ident()
    assert second == first


@pytest.mark.postgres  # SQLite keeps its in-memory test database open
def test_pool__conn_max_age_zero_closes_the_threads_connection_after_each_run() -> None:
    first = _run(Executor(2))
    second = _run(Executor(2))
    assert second[0] == first[0]  # the same thread ...
    pool = thread_pools._thread_pool(2)
    opened = pool.executor.submit(lambda: connections["default"].connection).result(timeout=10)
    assert opened is None  # ... with no connection left open between runs


@pytest.mark.postgres  # SQLite keeps its in-memory test database open
def test_pool__close_closes_every_pool_threads_connection() -> None:
    connection.settings_dict["CONN_MAX_AGE"] = None
    seen: list[object] = []
    barrier = threading.Barrier(2)
    try:
        executor = Executor(2)

        def hold() -> None:  # both pool threads open a connection
            connection.ensure_connection()
            seen.append(connections["default"])
            barrier.wait(timeout=10)

        futures = [executor.submit(hold) for _ in range(2)]
        for future in futures:
            future.result(timeout=10)
        executor.shutdown()
        assert len({id(c) for c in seen}) == 2
        assert all(c.connection is not None for c in seen)  # type: ignore[attr-defined]
        close_thread_pool()
    finally:
        connection.settings_dict["CONN_MAX_AGE"] = 0
    assert all(c.connection is None for c in seen)  # type: ignore[attr-defined]


def test_pool__work_left_running_retires_the_pool() -> None:
    release = threading.Event()
    executor = Executor(2)
    stuck = executor.submit(lambda: release.wait(timeout=10))
    old = thread_pools._thread_pool(2)
    executor.shutdown()  # the pass gives up on a wave that is still running
    assert old.retired.is_set()
    fresh = thread_pools._thread_pool(2)
    assert fresh is not old
    release.set()
    assert stuck.result(timeout=10) is True


def test_pool__finished_work_keeps_the_pool() -> None:
    executor = Executor(2)
    executor.submit(lambda: 1).result(timeout=10)
    pool = thread_pools._thread_pool(2)
    executor.shutdown()
    assert not pool.retired.is_set()
    assert thread_pools._thread_pool(2) is pool


def test_pool__each_calling_thread_has_its_own_pool() -> None:
    mine = thread_pools._thread_pool(2)
    theirs: list[thread_pools._Pool] = []
    other = threading.Thread(target=lambda: theirs.append(thread_pools._thread_pool(2)))
    other.start()
    other.join(timeout=10)
    assert theirs
    assert theirs[0] is not mine
    theirs[0].executor.shutdown(wait=True)


def test_pool__one_worker_runs_inline_without_a_pool() -> None:
    assert _run(Executor(1))[0] == threading.get_ident()
