from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import durable_agent
from durable_agent.agents.errors import InvalidSubmissionState, SubmissionNotFound
from durable_agent.agents.services import SubmissionStatus
from durable_agent.errors import InvalidInput
from durable_agent.maintenance import alarm
from durable_agent.models import Host, Submission, SubmissionOutcome, SubmissionState
from durable_agent.testing import FakeClock
from tests.agents.conftest import generation
from tests.factories import T0, SubmissionFactory, ThreadFactory

pytestmark = pytest.mark.django_db


def make(host: Host, state: SubmissionState = SubmissionState.READY, **fields: Any) -> Submission:
    thread = ThreadFactory(host=host, key="t")
    if state == SubmissionState.RUNNING:
        fields = {"lease_owner": "worker", "lease_expires_at": T0 + timedelta(seconds=30), **fields}
    if state == SubmissionState.SUSPENDED:
        fields = {"approval_reason": "pay 10 EUR?", **fields}
    if state == SubmissionState.SETTLED:
        fields = {"outcome": SubmissionOutcome.COMPLETED, "settled_at": T0, **fields}
    return SubmissionFactory(thread=thread, sequence=1, state=state, **fields)


def bumped(host: Host, before: tuple[int, int] | None) -> int:
    """How far ``dirty`` advanced since ``before``."""
    after = generation(host)
    assert after is not None
    return after[0] - (1 if before is None else before[0])


# -- abort ----------------------------------------------------------------------------------


def test_abort__ready_settles_aborted_at_once_and_arms_the_alarm(
    host: Host, clock: FakeClock
) -> None:
    row = make(host)
    before = generation(host)
    clock.advance(seconds=1)

    status = durable_agent.abort(row)

    assert status == SubmissionStatus(row.pk, "t", 1, "settled", "aborted", abort_requested=True)
    row.refresh_from_db()
    assert (row.state, row.outcome, row.attempts) == ("settled", "aborted", 0)
    assert row.abort_requested_at == row.settled_at == clock.now()
    assert bumped(host, before) == 1
    assert alarm.scheduled(host) == clock.now() + timedelta(milliseconds=50)


def test_abort__a_follower_settles_without_touching_the_head(host: Host, clock: FakeClock) -> None:
    head = make(host, SubmissionState.SUSPENDED)
    follower = SubmissionFactory(thread=head.thread, sequence=2)

    durable_agent.abort(str(follower.pk))

    assert Submission.objects.get(pk=follower.pk).outcome == SubmissionOutcome.ABORTED
    assert Submission.objects.get(pk=head.pk).state == SubmissionState.SUSPENDED


def test_abort__running_twice_changes_nothing_the_second_time(host: Host, clock: FakeClock) -> None:
    row = make(host, SubmissionState.RUNNING)
    durable_agent.abort(row.pk)
    before = generation(host)
    first = Submission.objects.get(pk=row.pk).abort_requested_at
    clock.advance(seconds=1)

    status = durable_agent.abort(str(row.pk))

    assert (status.state, status.abort_requested) == ("running", True)
    assert Submission.objects.get(pk=row.pk).abort_requested_at == first
    assert generation(host) == before


def test_abort__running_records_the_intent_for_the_agent(host: Host, clock: FakeClock) -> None:
    row = make(host, SubmissionState.RUNNING)

    status = durable_agent.abort(row)

    assert (status.state, status.abort_requested) == ("running", True)
    row.refresh_from_db()
    assert row.lease_owner == "worker"
    assert generation(host) == (2, 0)


def test_abort__suspended_settles_aborted_at_once(host: Host, clock: FakeClock) -> None:
    row = make(host, SubmissionState.SUSPENDED)

    status = durable_agent.abort(row)

    assert (status.state, status.outcome) == ("settled", "aborted")
    row.refresh_from_db()
    assert (row.settled_at, row.abort_requested_at) == (T0, T0)
    assert generation(host) == (2, 0)


def test_abort__settled_raises_and_writes_nothing(host: Host, clock: FakeClock) -> None:
    row = make(host, SubmissionState.SETTLED)

    with pytest.raises(InvalidSubmissionState) as caught:
        durable_agent.abort(row)

    assert caught.value.code == "invalid_submission_state"
    assert isinstance(caught.value, InvalidInput)
    assert Submission.objects.get(pk=row.pk).abort_requested_at is None
    assert generation(host) is None


def test_abort__unknown_settles_aborted_at_once(host: Host, clock: FakeClock) -> None:
    """An abort of an ``unknown`` submission is accepted and it ends ``aborted``, like a
    ``ready`` one: nothing is running it (docs/first-agent.md section 9)."""
    row = make(host, SubmissionState.UNKNOWN, side_effect_marked=True, attempts=1)

    status = durable_agent.abort(row)

    assert (status.state, status.outcome) == ("settled", "aborted")
    row.refresh_from_db()
    assert (row.settled_at, row.abort_requested_at) == (T0, T0)
    assert generation(host) == (2, 0)


# -- approve --------------------------------------------------------------------------------


def test_approve__makes_a_suspended_submission_ready(host: Host, clock: FakeClock) -> None:
    row = make(host, SubmissionState.SUSPENDED)

    status = durable_agent.approve(row)

    assert (status.state, status.outcome) == ("ready", None)
    row.refresh_from_db()
    assert row.approved_at == T0
    assert row.approval_reason == "pay 10 EUR?"
    assert generation(host) == (2, 0)
    assert alarm.scheduled(host) is not None


def test_approve__rejected_settles_failed(host: Host, clock: FakeClock) -> None:
    row = make(host, SubmissionState.SUSPENDED)

    status = durable_agent.approve(row.pk, approved=False)

    assert (status.state, status.outcome) == ("settled", "failed")
    row.refresh_from_db()
    assert row.error == {"reason": "rejected", "approval_reason": "pay 10 EUR?"}
    assert row.settled_at == T0
    assert generation(host) == (2, 0)


@pytest.mark.parametrize(
    "state",
    [
        SubmissionState.READY,
        SubmissionState.RUNNING,
        SubmissionState.UNKNOWN,
        SubmissionState.SETTLED,
    ],
)
def test_approve__anything_but_suspended_raises_and_writes_nothing(
    host: Host, clock: FakeClock, state: SubmissionState
) -> None:
    row = make(host, state)

    with pytest.raises(InvalidSubmissionState, match="only a suspended submission"):
        durable_agent.approve(row)

    assert Submission.objects.get(pk=row.pk).state == state
    assert generation(host) is None


def test_approve__approved_must_be_a_bool(host: Host, clock: FakeClock) -> None:
    row = make(host, SubmissionState.SUSPENDED)

    with pytest.raises(InvalidInput):
        durable_agent.approve(row, approved="yes")  # type: ignore[arg-type]

    assert Submission.objects.get(pk=row.pk).state == SubmissionState.SUSPENDED


# -- resolve_unknown ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "state", "settled", "error"),
    [
        ("completed", "settled", "completed", None),
        ("failed", "settled", "failed", {"reason": "resolved_failed"}),
        ("retry", "ready", None, None),
    ],
)
def test_resolve_unknown__applies_the_operators_decision(
    host: Host,
    clock: FakeClock,
    outcome: Any,
    state: str,
    settled: str | None,
    error: dict[str, str] | None,
) -> None:
    row = make(host, SubmissionState.UNKNOWN, side_effect_marked=True, attempts=1)

    status = durable_agent.resolve_unknown(row, outcome=outcome)

    assert (status.state, status.outcome) == (state, settled)
    row.refresh_from_db()
    assert row.error == error
    assert generation(host) == (2, 0)
    assert alarm.scheduled(host) is not None


@pytest.mark.parametrize("state", [SubmissionState.READY, SubmissionState.SUSPENDED])
def test_resolve_unknown__anything_but_unknown_raises(
    host: Host, clock: FakeClock, state: SubmissionState
) -> None:
    row = make(host, state)

    with pytest.raises(InvalidSubmissionState, match="only an unknown submission"):
        durable_agent.resolve_unknown(row, outcome="completed")

    assert generation(host) is None


def test_resolve_unknown__rejects_an_unknown_outcome(host: Host, clock: FakeClock) -> None:
    row = make(host, SubmissionState.UNKNOWN)

    with pytest.raises(InvalidInput, match="completed, failed, retry"):
        durable_agent.resolve_unknown(row, outcome="maybe")  # type: ignore[arg-type]

    assert Submission.objects.get(pk=row.pk).state == SubmissionState.UNKNOWN


# -- submission references ------------------------------------------------------------------


@pytest.mark.parametrize("ref", [987654, "987654", "abc", None, True, 1.5])
def test_services__unknown_submission_raises_not_found(
    host: Host, clock: FakeClock, ref: Any
) -> None:
    with pytest.raises(SubmissionNotFound) as caught:
        durable_agent.abort(ref)

    assert caught.value.code == "submission_not_found"


def test_services__unsaved_submission_raises_not_found(clock: FakeClock) -> None:
    with pytest.raises(SubmissionNotFound):
        durable_agent.approve(Submission())
