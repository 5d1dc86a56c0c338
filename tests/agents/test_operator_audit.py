"""Every operator action on a submission is audited with its actor and reason."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

import durable_agent
from durable_agent.agents.errors import InvalidSubmissionState
from durable_agent.errors import InvalidInput
from durable_agent.models import AlarmAudit, Host, SubmissionState
from durable_agent.testing import FakeClock
from tests.agents.test_services import make

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("state", "call", "action", "after"),
    [
        (SubmissionState.READY, durable_agent.abort, "abort", "settled/aborted"),
        (SubmissionState.RUNNING, durable_agent.abort, "abort", "running"),
        (SubmissionState.SUSPENDED, durable_agent.approve, "approve", "ready"),
        (
            SubmissionState.SUSPENDED,
            lambda row, **kw: durable_agent.approve(row, approved=False, **kw),
            "reject",
            "settled/failed",
        ),
        (
            SubmissionState.UNKNOWN,
            lambda row, **kw: durable_agent.resolve_unknown(row, outcome="retry", **kw),
            "resolve-unknown",
            "ready",
        ),
    ],
)
def test_operator_actions__write_one_audit_row_with_actor_and_reason(
    host: Host, clock: FakeClock, state: SubmissionState, call: Any, action: str, after: str
) -> None:
    row = make(host, state)

    call(row, actor="alice", reason="  customer asked  ")

    audit = AlarmAudit.objects.get(host=host)
    assert (audit.action, audit.actor, audit.reason, audit.at) == (
        action,
        "alice",
        "customer asked",
        clock.now(),
    )
    assert audit.detail["submission"] == row.pk
    assert (audit.detail["thread"], audit.detail["sequence"]) == ("t", 1)
    assert (audit.detail["before"], audit.detail["after"]) == (str(state), after)


def test_resolve_unknown__the_audit_keeps_the_outcome(host: Host, clock: FakeClock) -> None:
    row = make(host, SubmissionState.UNKNOWN)
    durable_agent.resolve_unknown(row, outcome="completed", actor="bob")
    audit = AlarmAudit.objects.get(host=host)
    assert (audit.detail["outcome"], audit.detail["after"]) == ("completed", "settled/completed")


def test_operator_actions__a_user_is_named_and_no_actor_is_system(
    host: Host, clock: FakeClock
) -> None:
    user = User.objects.create(username="carol")
    row = make(host, SubmissionState.SUSPENDED)
    durable_agent.approve(row, actor=user)
    durable_agent.abort(row)
    assert list(AlarmAudit.objects.order_by("id").values_list("action", "actor", "reason")) == [
        ("approve", "carol", ""),
        ("abort", "system", ""),
    ]


def test_operator_actions__a_refused_action_writes_no_audit(host: Host, clock: FakeClock) -> None:
    row = make(host, SubmissionState.SETTLED)
    with pytest.raises(InvalidSubmissionState):
        durable_agent.abort(row, actor="alice", reason="why")
    with pytest.raises(InvalidInput):
        durable_agent.abort(row, actor="alice", reason="x" * 5000)
    assert not AlarmAudit.objects.exists()
