from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.test import Client
from django.urls import resolve
from ninja.testing import TestClient

from durable_agent.agents import waiting
from durable_agent.maintenance import alarm
from durable_agent.models import AlarmAudit, Host, Submission, SubmissionOutcome, SubmissionState
from durable_agent.testing import FakeClock
from tests.api.conftest import assert_error
from tests.factories import T0, SubmissionFactory, ThreadFactory

pytestmark = pytest.mark.django_db


def make(host: Host, state: SubmissionState = SubmissionState.READY, **fields: Any) -> Submission:
    thread = ThreadFactory(host=host, key="t")
    if state == SubmissionState.SUSPENDED:
        fields = {"approval_reason": "pay 10 EUR?", **fields}
    if state == SubmissionState.SETTLED:
        fields = {"outcome": SubmissionOutcome.COMPLETED, "settled_at": T0, **fields}
    submission: Submission = SubmissionFactory(thread=thread, sequence=1, state=state, **fields)
    return submission


# -- submit ---------------------------------------------------------------------------------


def test_submit__admits_with_201_and_arms_the_host(
    client: TestClient, host: Host, echo: Any, repair_auth: dict[str, str]
) -> None:
    body = {"agent": "echo", "payload": {"n": 1}, "idempotency_key": "k1"}
    response = client.post(
        f"/hosts/{host.key}/threads/t1/submissions", json=body, headers=repair_auth
    )
    assert response.status_code == 201
    receipt = response.json()
    assert receipt == {
        "submission_id": receipt["submission_id"],
        "thread": "t1",
        "sequence": 1,
        "idempotency_key": "k1",
        "created": True,
        "state": "ready",
    }
    row = Submission.objects.get(pk=receipt["submission_id"])
    assert (row.agent, row.agent_version, row.payload) == ("echo", "1", {"n": 1})
    assert alarm.scheduled(host) is not None


def test_submit__replaying_the_key_returns_the_receipt_with_200(
    client: TestClient, host: Host, echo: Any, repair_auth: dict[str, str]
) -> None:
    path = f"/hosts/{host.key}/threads/t1/submissions"
    body = {"agent": "echo", "payload": [1, 2]}
    headers = {**repair_auth, "Idempotency-Key": "k1"}
    first = client.post(path, json=body, headers=headers)
    again = client.post(path, json={**body, "idempotency_key": "k1"}, headers=repair_auth)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == {**first.json(), "created": False}
    assert Submission.objects.count() == 1


def test_submit__the_same_key_with_another_payload_is_409(
    client: TestClient, host: Host, echo: Any, repair_auth: dict[str, str]
) -> None:
    path = f"/hosts/{host.key}/threads/t1/submissions"
    client.post(
        path, json={"agent": "echo", "payload": 1, "idempotency_key": "k"}, headers=repair_auth
    )
    response = client.post(
        path, json={"agent": "echo", "payload": 2, "idempotency_key": "k"}, headers=repair_auth
    )
    assert_error(response, 409, "idempotency_conflict")


def test_submit__header_and_body_keys_must_agree(
    client: TestClient, host: Host, echo: Any, repair_auth: dict[str, str]
) -> None:
    response = client.post(
        f"/hosts/{host.key}/threads/t1/submissions",
        json={"agent": "echo", "idempotency_key": "a"},
        headers={**repair_auth, "Idempotency-Key": "b"},
    )
    assert_error(response, 400, "idempotency_key_mismatch")
    assert not Submission.objects.exists()


def test_submit__without_a_key_every_request_admits(
    client: TestClient, host: Host, echo: Any, repair_auth: dict[str, str]
) -> None:
    path = f"/hosts/{host.key}/threads/a/b/c/submissions"  # thread keys may contain "/"
    for sequence in (1, 2):
        response = client.post(path, json={"agent": "echo"}, headers=repair_auth)
        assert (response.status_code, response.json()["sequence"]) == (201, sequence)
    assert response.json()["thread"] == "a/b/c"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"agent": "nobody"}, "agent_not_registered"),
        ({"agent": "echo", "version": "9"}, "agent_not_registered"),
        ({"agent": ""}, "validation_error"),
        ({}, "validation_error"),
        ({"agent": "echo", "idempotency_key": ""}, "validation_error"),
        ({"agent": "echo", "payload": {"a": "nul\x00"}}, "invalid_payload"),
        ({"agent": "echo", "payload": {"k\x00": 1}}, "invalid_payload"),
        ({"agent": "echo", "payload": "x" * (256 * 1024)}, "payload_too_large"),
    ],
)
def test_submit__invalid_input_is_422_and_writes_nothing(
    client: TestClient,
    host: Host,
    echo: Any,
    repair_auth: dict[str, str],
    body: Any,
    code: str,
) -> None:
    path = f"/hosts/{host.key}/threads/t1/submissions"
    assert_error(client.post(path, json=body, headers=repair_auth), 422, code)
    assert not Submission.objects.exists()


def test_submit__an_unknown_agent_is_422_with_advice_that_matches_autodiscovery(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    # docs/first-agent.md: agents in an installed app's agents.py are registered at startup
    path = f"/hosts/{host.key}/threads/t1/submissions"
    body = assert_error(
        client.post(path, json={"agent": "nobody"}, headers=repair_auth),
        422,
        "agent_not_registered",
    )
    assert "in the agents.py of an installed app" in body["message"]
    first_agent = (Path(__file__).resolve().parents[2] / "docs" / "first-agent.md").read_text()
    assert "imports the `agents` and `lanes` modules of every\ninstalled app" in first_agent


def test_submit__unknown_host_is_404_and_read_scope_403(
    client: TestClient,
    echo: Any,
    host: Host,
    read_auth: dict[str, str],
    repair_auth: dict[str, str],
) -> None:
    body = {"agent": "echo"}
    response = client.post("/hosts/nope/threads/t/submissions", json=body, headers=repair_auth)
    assert_error(response, 404, "host_not_found")
    response = client.post(f"/hosts/{host.key}/threads/t/submissions", json=body, headers=read_auth)
    assert_error(response, 403, "insufficient_scope")


# -- read, abort, approve, resolve ------------------------------------------------------------


def test_get_submission__its_state_and_timeline(
    client: TestClient, host: Host, read_auth: dict[str, str]
) -> None:
    row = make(host, payload={"q": "?"}, idempotency_key="k9")
    body = client.get(f"/submissions/{row.pk}", headers=read_auth).json()
    assert body["id"] == row.pk
    assert (body["host"], body["thread"], body["sequence"]) == (host.key, "t", 1)
    assert (body["agent"], body["agent_version"], body["idempotency_key"]) == ("echo", "1", "k9")
    assert (body["state"], body["outcome"], body["payload"]) == ("ready", None, {"q": "?"})
    assert body["created_at"] == "2030-01-01T00:00:00Z"


@pytest.mark.parametrize(("submission_id", "status"), [("12345", 404), ("0", 422), ("x", 422)])
def test_get_submission__unknown_or_invalid_id(
    client: TestClient, read_auth: dict[str, str], submission_id: str, status: int
) -> None:
    code = "submission_not_found" if status == 404 else "validation_error"
    assert_error(client.get(f"/submissions/{submission_id}", headers=read_auth), status, code)


def test_abort__a_ready_submission(
    client: TestClient, host: Host, clock: FakeClock, repair_auth: dict[str, str]
) -> None:
    row = make(host)
    response = client.post(f"/submissions/{row.pk}/abort", headers=repair_auth)
    assert response.status_code == 200
    assert response.json() == {
        "submission_id": row.pk,
        "thread": "t",
        "sequence": 1,
        "state": "settled",
        "outcome": "aborted",
        "abort_requested": True,
    }


def test_abort__a_running_submission_records_the_intent(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    row = make(host, SubmissionState.RUNNING, lease_owner="w", lease_expires_at=T0)
    body = client.post(f"/submissions/{row.pk}/abort", headers=repair_auth).json()
    assert (body["state"], body["outcome"], body["abort_requested"]) == ("running", None, True)


def test_abort__a_settled_submission_is_409(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    row = make(host, SubmissionState.SETTLED)
    response = client.post(f"/submissions/{row.pk}/abort", headers=repair_auth)
    body = assert_error(response, 409, "invalid_submission_state")
    assert body["detail"]["state"] == "settled"


def test_abort__needs_the_repair_scope_and_an_existing_submission(
    client: TestClient, host: Host, read_auth: dict[str, str], repair_auth: dict[str, str]
) -> None:
    row = make(host)
    assert_error(
        client.post(f"/submissions/{row.pk}/abort", headers=read_auth), 403, "insufficient_scope"
    )
    assert_error(
        client.post("/submissions/999/abort", headers=repair_auth), 404, "submission_not_found"
    )


@pytest.mark.parametrize(
    ("approved", "state", "outcome"), [(True, "ready", None), (False, "settled", "failed")]
)
def test_approve__answers_a_suspended_submission(
    client: TestClient,
    host: Host,
    repair_auth: dict[str, str],
    approved: bool,
    state: str,
    outcome: str | None,
) -> None:
    row = make(host, SubmissionState.SUSPENDED)
    response = client.post(
        f"/submissions/{row.pk}/approve", json={"approved": approved}, headers=repair_auth
    )
    assert (response.json()["state"], response.json()["outcome"]) == (state, outcome)


def test_approve__a_ready_submission_is_409(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    row = make(host)
    response = client.post(f"/submissions/{row.pk}/approve", json={}, headers=repair_auth)
    assert_error(response, 409, "invalid_submission_state")


@pytest.mark.parametrize(
    ("outcome", "state", "settled_as"),
    [
        ("completed", "settled", "completed"),
        ("failed", "settled", "failed"),
        ("retry", "ready", None),
    ],
)
def test_resolve__an_unknown_submission(
    client: TestClient,
    host: Host,
    repair_auth: dict[str, str],
    outcome: str,
    state: str,
    settled_as: str | None,
) -> None:
    row = make(host, SubmissionState.UNKNOWN)
    response = client.post(
        f"/submissions/{row.pk}/resolve", json={"outcome": outcome}, headers=repair_auth
    )
    assert (response.json()["state"], response.json()["outcome"]) == (state, settled_as)


def test_resolve__an_invalid_outcome_is_422_and_a_ready_submission_409(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    row = make(host)
    path = f"/submissions/{row.pk}/resolve"
    assert_error(
        client.post(path, json={"outcome": "maybe"}, headers=repair_auth), 422, "validation_error"
    )
    assert_error(
        client.post(path, json={"outcome": "retry"}, headers=repair_auth),
        409,
        "invalid_submission_state",
    )


# -- audit ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "path", "body", "action"),
    [
        (SubmissionState.READY, "abort", {"reason": "dup order"}, "abort"),
        (SubmissionState.SUSPENDED, "approve", {"approved": True, "reason": "ok"}, "approve"),
        (SubmissionState.SUSPENDED, "approve", {"approved": False, "reason": "no"}, "reject"),
        (
            SubmissionState.UNKNOWN,
            "resolve",
            {"outcome": "failed", "reason": "bank says no"},
            "resolve-unknown",
        ),
    ],
)
def test_operator_actions__are_audited_with_the_token_and_the_reason(
    client: TestClient,
    host: Host,
    repair_auth: dict[str, str],
    state: SubmissionState,
    path: str,
    body: dict[str, Any],
    action: str,
) -> None:
    row = make(host, state)
    response = client.post(f"/submissions/{row.pk}/{path}", json=body, headers=repair_auth)
    assert response.status_code == 200, response.json()
    audit = AlarmAudit.objects.get(host=host)
    assert (audit.action, audit.actor, audit.reason) == (action, "token:ops", body["reason"])
    assert audit.detail["submission"] == row.pk


def test_abort__without_a_body_or_with_null_is_audited_with_no_reason(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    # the document declares the optional body nullable: null is the same as no body
    first = make(host, SubmissionState.RUNNING, lease_owner="w", lease_expires_at=T0)
    second = SubmissionFactory(thread=first.thread, sequence=2, state=SubmissionState.READY)
    response = client.post(
        f"/submissions/{first.pk}/abort",
        data="null",
        headers={**repair_auth, "Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.json()
    assert client.post(f"/submissions/{second.pk}/abort", headers=repair_auth).status_code == 200
    assert list(AlarmAudit.objects.order_by("id").values_list("action", "actor", "reason")) == [
        ("abort", "token:ops", ""),
        ("abort", "token:ops", ""),
    ]


def test_operator_actions__a_session_user_is_the_actor(
    client: TestClient, host: Host, clock: FakeClock
) -> None:
    from tests.api.conftest import make_user

    user = make_user("dana", repair=True, perms=["view_submission"])
    row = make(host, SubmissionState.SUSPENDED)
    response = client.post(f"/submissions/{row.pk}/approve", json={"reason": "checked"}, user=user)
    assert response.status_code == 200, response.json()
    assert AlarmAudit.objects.get(host=host).actor == "dana"


# -- delayed work and the long poll ------------------------------------------------------------


def test_submit__not_before_delays_the_start_and_shows_in_the_submission(
    client: TestClient, host: Host, echo: Any, repair_auth: dict[str, str], clock: FakeClock
) -> None:
    body = {"agent": "echo", "payload": 1, "not_before": "2030-01-01T02:00:00+01:00"}
    response = client.post(
        f"/hosts/{host.key}/threads/t/submissions", json=body, headers=repair_auth
    )
    assert response.status_code == 201
    submission_id = response.json()["submission_id"]

    detail = client.get(f"/submissions/{submission_id}", headers=repair_auth).json()

    assert detail["not_before"] == "2030-01-01T01:00:00Z"
    assert Submission.objects.get(pk=submission_id).not_before == T0 + timedelta(hours=1)


@pytest.mark.parametrize(
    ("not_before", "code"),
    [
        ("2030-01-01T02:00:00", "validation_error"),  # no time zone
        ("2032-01-01T00:00:00Z", "invalid_input"),  # beyond 366 days
        ("soon", "validation_error"),
    ],
)
def test_submit__a_bad_not_before_is_422_and_writes_nothing(
    client: TestClient,
    host: Host,
    echo: Any,
    repair_auth: dict[str, str],
    clock: FakeClock,
    not_before: str,
    code: str,
) -> None:
    body = {"agent": "echo", "payload": 1, "not_before": not_before}
    path = f"/hosts/{host.key}/threads/t/submissions"
    assert_error(client.post(path, json=body, headers=repair_auth), 422, code)
    assert not Submission.objects.exists()


def test_get_submission__wait_answers_with_the_current_state_after_the_wait(
    client: TestClient, host: Host, echo: Any, repair_auth: dict[str, str]
) -> None:
    submission = make(host)
    started = time.monotonic()

    response = client.get(f"/submissions/{submission.pk}?wait=0.3", headers=repair_auth)

    assert response.status_code == 200
    assert response.json()["state"] == "ready"
    assert time.monotonic() - started >= 0.3


@pytest.mark.django_db(transaction=True)  # no test transaction: the request's would show
def test_get_submission__wait_holds_no_transaction_under_atomic_requests(
    host: Host, echo: Any, repair_auth: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through Django's handler (project/urls.py), where ATOMIC_REQUESTS applies: the long
    poll is exempt, so it waits (no 500 ``transaction_misuse``) with no transaction open; the
    other endpoints keep the request's transaction."""
    monkeypatch.setitem(connections.settings[DEFAULT_DB_ALIAS], "ATOMIC_REQUESTS", True)
    submission = make(host)
    in_transaction: list[bool] = []
    real_read = waiting._read

    def read(submission_id: int) -> Submission:
        in_transaction.append(transaction.get_connection().in_atomic_block)
        return real_read(submission_id)

    monkeypatch.setattr(waiting, "_read", read)
    web = Client()

    response = web.get(
        f"/api/durable-agent/submissions/{submission.pk}?wait=0.2", headers=repair_auth
    )

    assert response.status_code == 200, response.content
    assert response.json()["state"] == "ready"
    assert in_transaction
    assert not any(in_transaction)  # every read of the wait, in autocommit
    assert not hasattr(resolve("/api/durable-agent/health").func, "_non_atomic_requests")


@pytest.mark.parametrize("wait", ["-1", "31", "nan", "forever"])
def test_get_submission__a_bad_wait_is_422(
    client: TestClient, host: Host, repair_auth: dict[str, str], wait: str
) -> None:
    submission = make(host)
    response = client.get(f"/submissions/{submission.pk}?wait={wait}", headers=repair_auth)
    assert_error(response, 422, "validation_error")
