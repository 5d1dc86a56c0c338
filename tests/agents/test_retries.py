"""Retries: a failed attempt the agent's RetryPolicy names runs again from the due queue."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import durable_agent
from durable_agent import RetryPolicy
from durable_agent.agents import registry
from durable_agent.agents.errors import AgentAlreadyRegistered
from durable_agent.errors import InvalidInput
from durable_agent.maintenance import alarm, run_pass
from durable_agent.models import Host, Submission, SubmissionState
from durable_agent.runtime.protocol import START_LEAD
from durable_agent.testing import FakeClock, fake_random
from tests.agents.conftest import drain

pytestmark = pytest.mark.django_db


class Flaky(Exception):
    pass


def flaky_agent(failures: int, *, on: Any = (Flaky,), max_attempts: int = 4) -> list[int]:
    """Register ``flaky``: it raises Flaky on its first ``failures`` attempts; returns the
    attempt numbers it saw."""
    seen: list[int] = []

    @durable_agent.agent(
        "flaky",
        retry=RetryPolicy(on=on, max_attempts=max_attempts, backoff=10, cap=25),
    )
    def flaky(ctx: Any, payload: Any) -> Any:
        seen.append(ctx.attempt)
        if ctx.attempt <= failures:
            raise Flaky(f"attempt {ctx.attempt}")
        return {"attempt": ctx.attempt}

    return seen


def test_retries__a_retried_failure_waits_in_the_due_queue_then_completes(
    host: Host, clock: FakeClock
) -> None:
    seen = flaky_agent(2)
    receipt = durable_agent.submit(host=host, thread="t", agent="flaky", payload=None)
    start = clock.now()

    with fake_random(0.5):
        run_pass(host)

    row = Submission.objects.get(pk=receipt.submission_id)
    assert seen == [1]
    assert row.state == SubmissionState.READY  # not settled: it runs again
    assert row.attempts == 1
    assert row.error is not None
    assert row.error["message"] == "attempt 1"
    # b = min(cap 25, 10 * 2**0) = 10 s, jittered into [5, 10]: 7.5 s with jitter 0.5
    assert row.not_before == start + timedelta(seconds=7.5)
    assert alarm.scheduled(host) == row.not_before - START_LEAD  # the next try, begun on time

    clock.set(row.not_before - START_LEAD - timedelta(milliseconds=1))
    run_pass(host)
    assert seen == [1]  # never sooner (within the lead the attempt is held until its time)

    with fake_random(0.0):
        clock.set(row.not_before)
        run_pass(host)
    row.refresh_from_db()
    assert seen == [1, 2]
    assert row.not_before == clock.now() + timedelta(seconds=10)  # 20 s, jitter 0 -> 10 s

    with fake_random(0.0):
        drain(host, clock)
    row.refresh_from_db()
    assert seen == [1, 2, 3]
    assert (row.state, row.outcome, row.result) == ("settled", "completed", {"attempt": 3})
    assert row.attempts == 3
    assert row.error is None


def test_retries__the_last_attempt_settles_failed(host: Host, clock: FakeClock) -> None:
    seen = flaky_agent(10, max_attempts=3)
    receipt = durable_agent.submit(host=host, thread="t", agent="flaky", payload=None)

    drain(host, clock)

    row = Submission.objects.get(pk=receipt.submission_id)
    assert seen == [1, 2, 3]
    assert (row.state, row.outcome, row.attempts) == ("settled", "failed", 3)
    assert row.error["message"] == "attempt 3"


def test_retries__an_exception_the_policy_does_not_name_settles_at_once(
    host: Host, clock: FakeClock
) -> None:
    seen = flaky_agent(10, on=(KeyError,))
    receipt = durable_agent.submit(host=host, thread="t", agent="flaky", payload=None)

    drain(host, clock)

    row = Submission.objects.get(pk=receipt.submission_id)
    assert seen == [1]
    assert (row.state, row.outcome) == ("settled", "failed")


def test_retries__an_abort_during_the_attempt_is_not_retried(host: Host, clock: FakeClock) -> None:
    @durable_agent.agent("stops", retry=RetryPolicy(max_attempts=5))
    def stops(ctx: Any, payload: Any) -> Any:
        durable_agent.abort(ctx.submission.pk)
        raise Flaky("after the abort")

    receipt = durable_agent.submit(host=host, thread="t", agent="stops", payload=None)
    drain(host, clock)

    row = Submission.objects.get(pk=receipt.submission_id)
    assert (row.state, row.outcome, row.attempts) == ("settled", "aborted", 1)


def test_retries__a_thread_waits_for_its_retried_head(host: Host, clock: FakeClock) -> None:
    seen = flaky_agent(1)
    first = durable_agent.submit(host=host, thread="t", agent="flaky", payload=None)
    behind = durable_agent.submit(host=host, thread="t", agent="flaky", payload=None)

    run_pass(host)
    assert Submission.objects.get(pk=behind.submission_id).attempts == 0

    drain(host, clock)

    rows = Submission.objects.order_by("sequence")
    assert [(r.pk, r.outcome) for r in rows] == [
        (first.submission_id, "completed"),
        (behind.submission_id, "completed"),
    ]
    assert seen == [1, 2, 1, 2]  # each submission counts its own attempts, one after the other


@pytest.mark.parametrize(
    "kwargs",
    [
        {"on": (ValueError, "nope")},
        {"on": (KeyboardInterrupt,)},
        {"max_attempts": 1},
        {"max_attempts": 101},
        {"max_attempts": 2.5},
        {"backoff": -1},
        {"backoff": float("inf")},
        {"backoff": 10, "cap": 5},
    ],
)
def test_retries__a_bad_policy_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        RetryPolicy(**kwargs)


def test_retries__the_policy_is_part_of_the_binding() -> None:
    def fn(ctx: Any, payload: Any) -> None:
        return None

    registry.register("a", fn, retry=RetryPolicy(max_attempts=2))
    registry.register("a", fn, retry=RetryPolicy(max_attempts=2))  # the same: a no-op
    with pytest.raises(AgentAlreadyRegistered):
        registry.register("a", fn, retry=RetryPolicy(max_attempts=3))
    with pytest.raises(InvalidInput):
        registry.register("b", fn, retry={"max_attempts": 3})  # type: ignore[arg-type]


def test_retries__a_crash_before_the_retry_is_recorded_leaves_it_to_recovery(
    host: Host, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_agent.agents import retries
    from durable_agent.maintenance.operators.audit import audit_host

    seen = flaky_agent(1)
    receipt = durable_agent.submit(host=host, thread="t", agent="flaky", payload=None)

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the worker died while recording the retry")

    with monkeypatch.context() as patched:
        patched.setattr(retries, "waiting_fields", crash)
        with pytest.raises(RuntimeError, match="recording the retry"):
            run_pass(host)

    row = Submission.objects.get(pk=receipt.submission_id)
    assert (row.state, row.attempts) == ("running", 1)  # nothing of the retry was written
    assert audit_host(Host.objects.select_related("alarm").get(pk=host.pk)).ok

    drain(host, clock)  # the lease expires; recovery hands the attempt back, it runs again

    row.refresh_from_db()
    assert seen == [1, 2]
    assert (row.state, row.outcome, row.attempts) == ("settled", "completed", 2)
