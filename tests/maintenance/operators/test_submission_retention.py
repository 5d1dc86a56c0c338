"""Retention of settled submissions (``RETENTION_SUBMISSIONS_MS``): the sweep prunes old
settled history, never work in flight nor the last submission of a thread."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.test import override_settings

from durable_agent.agents import registry, services
from durable_agent.maintenance import retention
from durable_agent.models import Submission, SubmissionState, Thread
from durable_agent.tasks import sweep
from durable_agent.testing import FakeClock
from tests.factories import SubmissionFactory, ThreadFactory

pytestmark = pytest.mark.django_db
DAY = timedelta(days=1)


def _sub(thread: Thread, sequence: int, *, settled_at: datetime | None = None) -> Submission:
    if settled_at is None:
        return SubmissionFactory(thread=thread, sequence=sequence)
    return SubmissionFactory(
        thread=thread,
        sequence=sequence,
        state=SubmissionState.SETTLED,
        outcome="completed",
        settled_at=settled_at,
    )


def _history(now: datetime) -> dict[str, Submission]:
    busy, done, young = ThreadFactory(key="busy"), ThreadFactory(key="done"), ThreadFactory()
    return {
        "busy-1": _sub(busy, 1, settled_at=now - 9 * DAY),
        "busy-2": _sub(busy, 2, settled_at=now - 8 * DAY),
        "busy-3": _sub(busy, 3),  # ready: work in flight
        "done-1": _sub(done, 1, settled_at=now - 9 * DAY),
        "done-2": _sub(done, 2, settled_at=now - 9 * DAY),  # the thread's last
        "young-1": _sub(young, 1, settled_at=now - DAY),
        "young-2": _sub(young, 2, settled_at=now - DAY),
    }


def _left(rows: dict[str, Submission]) -> set[str]:
    kept = set(Submission.objects.values_list("pk", flat=True))
    return {name for name, row in rows.items() if row.pk in kept}


def test_submissions__kept_forever_by_default(clock: FakeClock) -> None:
    rows = _history(clock.now())
    assert sweep()["pruned_submissions"] == 0
    assert _left(rows) == set(rows)


def test_submissions__old_settled_history_goes_work_and_each_threads_last_stay(
    clock: FakeClock,
) -> None:
    rows = _history(clock.now())
    with override_settings(
        DURABLE_AGENT={"RETENTION_SUBMISSIONS_MS": 7 * DAY // timedelta(milliseconds=1)}
    ):
        assert sweep()["pruned_submissions"] == 3
        assert sweep()["pruned_submissions"] == 0
    assert _left(rows) == {"busy-3", "done-2", "young-1", "young-2"}


def test_submissions__pruned_in_batches_oldest_first(clock: FakeClock) -> None:
    thread = ThreadFactory()
    for n in range(1, 8):
        _sub(thread, n, settled_at=clock.now() - (20 - n) * DAY)
    settings = {"RETENTION_SUBMISSIONS_MS": 1_000, "RETENTION_BATCH_SIZE": 4}
    with override_settings(DURABLE_AGENT=settings):
        assert retention.prune()["pruned_submissions"] == 4
        assert list(Submission.objects.values_list("sequence", flat=True)) == [5, 6, 7]
        assert retention.prune()["pruned_submissions"] == 2
    assert list(Submission.objects.values_list("sequence", flat=True)) == [7]


def test_submissions__a_thread_never_reuses_a_sequence_after_pruning(
    clock: FakeClock, runtime: object
) -> None:
    thread = ThreadFactory(key="talk")
    for n in (1, 2):
        _sub(thread, n, settled_at=clock.now() - 9 * DAY)
    with override_settings(DURABLE_AGENT={"RETENTION_SUBMISSIONS_MS": 1_000}):
        assert sweep()["pruned_submissions"] == 1
    saved = registry.snapshot()
    registry.register("echo", lambda ctx, payload: payload)
    try:
        receipt = services.submit(host=thread.host, thread="talk", agent="echo", payload={})
    finally:
        registry.restore(saved)
    assert receipt.sequence == 3
