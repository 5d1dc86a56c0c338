"""Run work in threads released together, for the concurrency tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections


def run_threads(work: Callable[[int], Any], count: int, *, timeout: float = 120) -> list[Any]:
    """Run ``work(i)`` in ``count`` threads released together by a barrier; return the results
    in order, re-raise the first failure, and fail if a thread is still running after
    ``timeout`` seconds (a deadlock). Each thread closes its database connections."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = work(i)
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not [t for t in threads if t.is_alive()], "deadlock: threads still running"
    if errors:
        raise errors[0]
    return results
