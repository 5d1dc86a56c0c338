"""Drive alarms through django-q's own scheduler, in-process, on the pinned clock.

``fire_due(clock)`` runs django-q's stock ``scheduler()`` (which sees the fake clock) and then
executes the tasks it enqueued on the ORM broker, like a worker would. Tests that use it need
``django_db(transaction=True)``: the scheduler closes connections that sit in a transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import django_q.scheduler
from django.utils.module_loading import import_string
from django_q.brokers import get_broker
from django_q.models import OrmQ, Schedule

from durable_agent.testing import FakeClock


@contextmanager
def scheduler_clock(clock: FakeClock) -> Iterator[None]:
    """Make django-q's scheduler read the fake clock (it compares ``next_run < now``)."""
    original = django_q.scheduler.timezone
    django_q.scheduler.timezone = SimpleNamespace(now=clock.now)  # type: ignore[assignment]
    try:
        yield
    finally:
        django_q.scheduler.timezone = original


def run_enqueued() -> list[Any]:
    """Run every task waiting on the ORM broker, oldest first, and acknowledge it."""
    results = []
    for row in OrmQ.objects.order_by("pk"):
        task = row.task
        func = task["func"]
        target = import_string(func) if isinstance(func, str) else func
        results.append(target(*task.get("args", ()), **task.get("kwargs", {})))
        row.delete()
    return results


def fire_due(clock: FakeClock) -> list[Any]:
    """One scheduler scan at the fake time, then the tasks it enqueued."""
    with scheduler_clock(clock):
        django_q.scheduler.scheduler(broker=get_broker())
    return run_enqueued()


def next_armed() -> Any:
    row = Schedule.objects.exclude(repeats=0).order_by("next_run").first()
    return None if row is None else row.next_run


def drain_alarms(clock: FakeClock, *, limit: int = 500) -> list[Any]:
    """Advance the clock to each armed slot and let django-q fire it, until none is armed."""
    results: list[Any] = []
    for _ in range(limit):
        due = next_armed()
        if due is None:
            return results
        if due >= clock.now():
            clock.set(due + timedelta(microseconds=1))  # the scan is next_run < now
        results += fire_due(clock)
    raise AssertionError(f"alarms still armed after {limit} scheduler scans")
