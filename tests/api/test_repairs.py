from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from ninja.testing import TestClient

from durable_agent.maintenance import alarm, gate, passes
from durable_agent.models import AlarmAudit, BindingRetry, DueLane, Host, RecoveryFault
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.api.conftest import assert_error
from tests.factories import T0, BindingRetryFactory, DueLaneFactory, RecoveryFaultFactory
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db

SOON = "2030-01-01T00:00:00.050Z"  # T0 + the minimum alarm delay


def post(client: TestClient, path: str, auth: dict[str, str], body: Any = None) -> Any:
    return client.post(path, json=body, headers=auth)


# -- rearm ----------------------------------------------------------------------------------


def test_rearm__a_disarmed_host_is_armed_and_audited(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    assert alarm.scheduled(host) is None
    response = post(client, f"/hosts/{host.key}/rearm", repair_auth, {"reason": "stuck"})
    assert response.status_code == 200
    assert response.json() == {"host": host.key, "alarm": SOON}
    assert alarm.scheduled(host) == T0 + timedelta(milliseconds=50)
    audit = AlarmAudit.objects.get(host=host)
    assert (audit.action, audit.actor, audit.reason) == ("rearm", "token:ops", "stuck")
    assert (audit.old_deadline, audit.new_deadline) == (None, T0 + timedelta(milliseconds=50))


def test_rearm__an_explicit_earlier_time(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    body = {"at": "2029-12-31T19:00:00-05:00", "reason": "now"}  # = T0, in another offset
    response = post(client, f"/hosts/{host.key}/rearm", repair_auth, body)
    assert response.json() == {"host": host.key, "alarm": "2030-01-01T00:00:00Z"}


def test_rearm__a_later_time_than_due_work_is_409(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    body = {"at": "2030-01-02T00:00:00Z", "reason": "later"}
    error = assert_error(
        post(client, f"/hosts/{host.key}/rearm", repair_auth, body), 409, "rearm_refused"
    )
    assert error["detail"]["requested"] == "2030-01-02T00:00:00+00:00"
    assert not AlarmAudit.objects.exists()


def test_rearm__nothing_due_disarms(
    client: TestClient, host: Host, repair_auth: dict[str, str], runtime: ScriptedRuntime
) -> None:
    caught_up(host)
    response = post(client, f"/hosts/{host.key}/rearm", repair_auth, {"reason": "check"})
    assert response.json() == {"host": host.key, "alarm": None}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "validation_error"),
        ({"reason": ""}, "validation_error"),
        ({"reason": "x" * 2001}, "validation_error"),
        ({"reason": "a\x00b"}, "validation_error"),
        ({"reason": 7}, "validation_error"),
        ({"reason": "   "}, "invalid_input"),
        ({"reason": "x", "at": "2030-01-01T00:00:00"}, "validation_error"),  # naive
        ({"reason": "x", "at": "9999-12-31T23:00:00-05:00"}, "validation_error"),  # overflows
        ({"reason": "x", "at": "soon"}, "validation_error"),
    ],
)
def test_rearm__invalid_body_is_422(
    client: TestClient, host: Host, repair_auth: dict[str, str], body: Any, code: str
) -> None:
    assert_error(post(client, f"/hosts/{host.key}/rearm", repair_auth, body), 422, code)
    assert not AlarmAudit.objects.exists()


def test_rearm__validation_errors_name_the_field(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    error = assert_error(
        post(client, f"/hosts/{host.key}/rearm", repair_auth, {"reason": ""}),
        422,
        "validation_error",
    )
    assert error["detail"]["errors"] == [
        {
            "loc": ["body", "reason"],
            "msg": "String should have at least 1 character",
            "type": "string_too_short",
        }
    ]


def test_rearm__unknown_host_is_404(client: TestClient, repair_auth: dict[str, str]) -> None:
    assert_error(
        post(client, "/hosts/nope/rearm", repair_auth, {"reason": "x"}), 404, "host_not_found"
    )


def test_rearm__unparsable_json_is_400(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    response = client.post(f"/hosts/{host.key}/rearm", data="{nope", headers=repair_auth)
    assert_error(response, 400, "bad_request")


# -- pass -----------------------------------------------------------------------------------


def test_pass__runs_now_and_returns_its_report(
    client: TestClient, host: Host, runtime: ScriptedRuntime, repair_auth: dict[str, str]
) -> None:
    runtime.submit(host, "t1", behaviour="settle")
    response = post(client, f"/hosts/{host.key}/pass", repair_auth, {"reason": "drain"})
    assert response.status_code == 200
    report = response.json()
    assert (report["host"], report["phase"], report["settled"]) == (host.key, "actionable", 1)
    assert runtime.nonterminal(host.pk) == []
    audit = AlarmAudit.objects.get(host=host)
    assert (audit.action, audit.actor, audit.reason) == ("pass", "token:ops", "drain")


def test_pass__the_body_is_optional(
    client: TestClient, host: Host, runtime: ScriptedRuntime, repair_auth: dict[str, str]
) -> None:
    assert client.post(f"/hosts/{host.key}/pass", headers=repair_auth).status_code == 200
    assert AlarmAudit.objects.get(host=host).reason == ""


def test_pass__a_failing_pass_is_500_pass_failed_and_stays_audited(
    client: TestClient,
    host: Host,
    runtime: ScriptedRuntime,
    repair_auth: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def explode(host: Any) -> None:
        raise RuntimeError("lane handler exploded")

    monkeypatch.setattr(passes, "run_pass", explode)
    response = client.post(f"/hosts/{host.key}/pass", headers=repair_auth)
    assert_error(response, 500, "pass_failed")
    assert "RuntimeError" in response.json()["message"]
    assert "lane handler exploded" in caplog.text
    assert AlarmAudit.objects.filter(host=host, action="pass").count() == 1


# -- unpark ---------------------------------------------------------------------------------


@pytest.fixture
def parked(host: Host, runtime: ScriptedRuntime) -> DueLane:
    caught_up(host)
    lane: DueLane = DueLaneFactory(
        host=host, lane="outbox", state="parked", stalls=8, due_at=None, revision=3
    )
    return lane


def test_unpark__a_parked_lane_is_due_now_and_audited(
    client: TestClient, host: Host, parked: DueLane, repair_auth: dict[str, str]
) -> None:
    response = post(client, f"/hosts/{host.key}/lanes/outbox/unpark", repair_auth, {"reason": "ok"})
    assert response.status_code == 200
    body = response.json()
    assert body == {
        "host": host.key,
        "action": "unpark",
        "audit_id": body["audit_id"],
        "alarm": SOON,
    }
    parked.refresh_from_db()
    assert (parked.state, parked.stalls, parked.due_at) == ("pending", 0, T0)
    audit = AlarmAudit.objects.get(pk=body["audit_id"])
    assert (audit.action, audit.actor, audit.detail["lane"]) == ("unpark", "token:ops", "outbox")


def test_unpark__a_lane_that_is_not_parked_is_409(
    client: TestClient, host: Host, runtime: ScriptedRuntime, repair_auth: dict[str, str]
) -> None:
    caught_up(host)
    gate.schedule(host, "outbox", T0)
    response = client.post(f"/hosts/{host.key}/lanes/outbox/unpark", headers=repair_auth)
    assert_error(response, 409, "not_repairable")


def test_unpark__an_unknown_lane_is_404(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    response = client.post(f"/hosts/{host.key}/lanes/nope/unpark", headers=repair_auth)
    assert_error(response, 404, "repair_target_not_found")


@pytest.mark.parametrize(
    ("lane", "code"),
    [
        ("bad%20lane", "validation_error"),
        ("x" * 257, "validation_error"),
        ("agent:custom", "invalid_lane_id"),  # the agent: namespace is reserved
    ],
)
def test_unpark__an_invalid_lane_id_is_422(
    client: TestClient, host: Host, repair_auth: dict[str, str], lane: str, code: str
) -> None:
    response = client.post(f"/hosts/{host.key}/lanes/{lane}/unpark", headers=repair_auth)
    assert_error(response, 422, code)


def test_unpark__a_reason_that_is_too_long_is_422(
    client: TestClient, host: Host, parked: DueLane, repair_auth: dict[str, str]
) -> None:
    path = f"/hosts/{host.key}/lanes/outbox/unpark"
    assert_error(post(client, path, repair_auth, {"reason": "x" * 2001}), 422, "validation_error")
    assert not AlarmAudit.objects.exists()


# -- binding retries and faults -------------------------------------------------------------


def test_retry_binding__releases_the_head_and_audits(
    client: TestClient, host: Host, runtime: ScriptedRuntime, repair_auth: dict[str, str]
) -> None:
    caught_up(host)
    retry = BindingRetryFactory(host=host, thread="t1", submission="s1")
    response = client.post(
        f"/hosts/{host.key}/binding-retries/{retry.pk}/retry", headers=repair_auth
    )
    assert response.status_code == 200
    assert response.json()["action"] == "retry-binding"
    assert not BindingRetry.objects.exists()
    assert alarm.scheduled(host) == T0 + timedelta(milliseconds=50)


@pytest.mark.parametrize(("retry_id", "status"), [("999", 404), ("0", 422), ("abc", 422)])
def test_retry_binding__unknown_or_invalid_id(
    client: TestClient, host: Host, repair_auth: dict[str, str], retry_id: str, status: int
) -> None:
    response = client.post(
        f"/hosts/{host.key}/binding-retries/{retry_id}/retry", headers=repair_auth
    )
    assert_error(
        response, status, "repair_target_not_found" if status == 404 else "validation_error"
    )


def test_retry_binding__another_hosts_retry_is_404(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    retry = BindingRetryFactory()
    response = client.post(
        f"/hosts/{host.key}/binding-retries/{retry.pk}/retry", headers=repair_auth
    )
    assert_error(response, 404, "repair_target_not_found")
    assert BindingRetry.objects.filter(pk=retry.pk).exists()


@pytest.mark.parametrize("thread", ["t1", "tenant/42/inbox"])
def test_retry_fault__retries_now(
    client: TestClient,
    host: Host,
    clock: FakeClock,
    runtime: ScriptedRuntime,
    repair_auth: dict[str, str],
    thread: str,
) -> None:
    caught_up(host)
    RecoveryFaultFactory(host=host, thread=thread, retry_at=T0 + timedelta(minutes=5))
    clock.advance(seconds=1)
    response = post(
        client, f"/hosts/{host.key}/faults/{thread}/retry", repair_auth, {"reason": "x"}
    )
    assert response.status_code == 200
    assert response.json()["action"] == "retry-fault"
    assert RecoveryFault.objects.get(thread=thread).retry_at == clock.now()


def test_retry_fault__unknown_thread_is_404(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    response = client.post(f"/hosts/{host.key}/faults/t9/retry", headers=repair_auth)
    assert_error(response, 404, "repair_target_not_found")
