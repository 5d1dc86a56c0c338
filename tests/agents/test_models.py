from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from durable_agent.models import Submission, SubmissionOutcome, SubmissionState, Thread
from tests.factories import T0, SubmissionFactory, ThreadFactory

pytestmark = pytest.mark.django_db


def _violates(name: str, **fields: Any) -> None:
    with pytest.raises(IntegrityError, match=name):
        with transaction.atomic():
            SubmissionFactory(**fields)


def test_thread__key_is_unique_per_host(host: Any) -> None:
    ThreadFactory(host=host, key="a")
    ThreadFactory(key="a")  # another host

    with pytest.raises(IntegrityError), transaction.atomic():
        ThreadFactory(host=host, key="a")


def test_thread__key_may_not_be_empty(host: Any) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        Thread.objects.create(host=host, key="", created_at=T0)


def test_submission__sequence_is_unique_per_thread() -> None:
    first = SubmissionFactory(sequence=1)

    with pytest.raises(IntegrityError), transaction.atomic():
        SubmissionFactory(thread=first.thread, sequence=1)


def test_submission__idempotency_key_is_unique_per_thread() -> None:
    first = SubmissionFactory(idempotency_key="k")
    SubmissionFactory(idempotency_key="k")  # another thread

    with pytest.raises(IntegrityError), transaction.atomic():
        SubmissionFactory(thread=first.thread, idempotency_key="k")


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("da_submission_outcome_iff_settled", {"state": SubmissionState.SETTLED}),
        (
            "da_submission_outcome_iff_settled",
            {"state": SubmissionState.READY, "outcome": SubmissionOutcome.COMPLETED},
        ),
        (
            "da_submission_outcome_iff_settled",
            {"state": SubmissionState.SETTLED, "outcome": "bogus", "settled_at": T0},
        ),
        ("da_submission_lease_iff_running", {"state": SubmissionState.RUNNING}),
        (
            "da_submission_lease_iff_running",
            {"state": SubmissionState.RUNNING, "lease_owner": "me"},
        ),
        (
            "da_submission_lease_iff_running",
            {"state": SubmissionState.READY, "lease_owner": "me", "lease_expires_at": T0},
        ),
        ("da_submission_attempts_nonnegative", {"attempts": -1}),
        ("da_submission_sequence_positive", {"sequence": 0}),
        ("da_submission_state_valid", {"state": "paused"}),
        ("da_submission_suspended_has_reason", {"state": SubmissionState.SUSPENDED}),
        ("da_submission_idempotency_key_not_empty", {"idempotency_key": ""}),
        ("da_submission_agent_not_empty", {"agent": ""}),
    ],
)
def test_submission__constraint_rejects(name: str, fields: dict[str, Any]) -> None:
    _violates(name, **fields)


def test_submission__valid_rows_of_every_state_are_accepted() -> None:
    SubmissionFactory(state=SubmissionState.READY)
    SubmissionFactory(state=SubmissionState.RUNNING, lease_owner="me", lease_expires_at=T0)
    SubmissionFactory(state=SubmissionState.SUSPENDED, approval_reason="pay?")
    SubmissionFactory(state=SubmissionState.UNKNOWN)
    SubmissionFactory(
        state=SubmissionState.SETTLED, outcome=SubmissionOutcome.ABORTED, settled_at=T0
    )

    assert Submission.objects.nonterminal().count() == 4
    assert Submission.objects.settled().count() == 1


def test_submission__nonterminal_index_exists() -> None:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Submission._meta.db_table)

    index = constraints["da_submission_nonterminal"]
    assert index["index"] is True
    assert index["columns"] == ["host_id", "thread_id", "sequence"]


def test_submission__querysets_read_as_states() -> None:
    expired = SubmissionFactory(
        state=SubmissionState.RUNNING, lease_owner="me", lease_expires_at=T0
    )
    live = SubmissionFactory(
        state=SubmissionState.RUNNING, lease_owner="you", lease_expires_at=T0.replace(year=2031)
    )
    intent = SubmissionFactory(abort_requested_at=T0)
    done = SubmissionFactory(state=SubmissionState.SETTLED, outcome="completed", settled_at=T0)

    assert set(Submission.objects.nonterminal()) == {expired, live, intent}
    assert list(Submission.objects.settled()) == [done]
    assert list(Submission.objects.abort_requested()) == [intent]
    assert str(intent) == f"{intent.thread_id}#{intent.sequence} ready"


def test_thread__str_names_host_and_key(host: Any) -> None:
    assert str(ThreadFactory(host=host, key="a")) == f"{host.pk}:a"
