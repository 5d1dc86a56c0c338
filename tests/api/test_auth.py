from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client, RequestFactory, override_settings
from ninja.testing import TestClient

from durable_agent.api import failures
from durable_agent.api.auth import SESSION_PERMISSIONS, StaffSessionAuth
from durable_agent.api.errors import ApiError
from durable_agent.api.tokens import digest, issue_token, revoke_token
from durable_agent.checks import check_settings
from durable_agent.models import AlarmAudit, ApiToken, DueLane, Host, Submission
from durable_agent.testing import FakeClock
from project.api import openapi_document
from tests.api.conftest import assert_error, bearer, make_user
from tests.factories import AlarmAuditFactory, DueLaneFactory, SubmissionFactory

pytestmark = pytest.mark.django_db


def test_auth__no_credentials_is_401_with_a_bearer_challenge(
    client: TestClient, host: Host
) -> None:
    response = client.get("/hosts")
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_auth__unknown_and_revoked_tokens_are_401(client: TestClient, clock: FakeClock) -> None:
    secret = issue_token(name="gone", scope="repair").secret
    assert client.get("/health", headers=bearer(secret)).status_code == 200
    revoke_token(name="gone")
    assert_error(client.get("/health", headers=bearer(secret)), 401, "invalid_token")
    assert_error(client.get("/health", headers=bearer("da_nope")), 401, "invalid_token")
    assert_error(client.get("/health", headers=bearer("")), 401, "invalid_token")
    assert_error(client.get("/health", headers=bearer("é" * 300)), 401, "invalid_token")


def test_auth__a_bad_token_never_falls_back_to_the_session(
    client: TestClient, clock: FakeClock
) -> None:
    user = make_user("admin", repair=True, perms=["view_host"])
    response = client.get("/health", headers=bearer("da_wrong"), user=user)
    assert_error(response, 401, "invalid_token")
    assert 'error="invalid_token"' in response["WWW-Authenticate"]
    # another scheme in Authorization is ignored, so the session decides
    assert (
        client.get("/health", headers={"Authorization": "Basic eDp5"}, user=user).status_code == 200
    )


def test_auth__read_token_reads_but_may_not_repair(
    client: TestClient, host: Host, read_auth: dict[str, str]
) -> None:
    assert client.get(f"/hosts/{host.key}", headers=read_auth).status_code == 200
    response = client.post(f"/hosts/{host.key}/rearm", json={"reason": "x"}, headers=read_auth)
    assert_error(response, 403, "insufficient_scope")
    assert not AlarmAudit.objects.exists()


def test_auth__repairs_are_audited_under_the_token_name(
    client: TestClient, host: Host, repair_auth: dict[str, str]
) -> None:
    response = client.post(f"/hosts/{host.key}/rearm", json={"reason": "x"}, headers=repair_auth)
    assert response.status_code == 200
    assert AlarmAudit.objects.get().actor == "token:ops"


def test_auth__staff_session_reads_and_repairs_only_with_the_permission(
    client: TestClient, host: Host, clock: FakeClock
) -> None:
    viewer = make_user("viewer", perms=["view_host"])
    assert client.get("/hosts", user=viewer).status_code == 200
    response = client.post(f"/hosts/{host.key}/rearm", json={"reason": "x"}, user=viewer)
    assert_error(response, 403, "insufficient_scope")

    operator = make_user("operator", repair=True, perms=["view_host"])
    response = client.post(f"/hosts/{host.key}/rearm", json={"reason": "x"}, user=operator)
    assert response.status_code == 200
    assert AlarmAudit.objects.get().actor == "operator"


def test_auth__non_staff_and_inactive_users_are_403(client: TestClient, clock: FakeClock) -> None:
    assert_error(client.get("/hosts", user=make_user("someone", staff=False)), 403, "not_staff")
    inactive = make_user("left", repair=True)
    inactive.is_active = False
    assert_error(client.get("/hosts", user=inactive), 403, "not_staff")


def test_tokens__only_the_digest_is_stored(clock: FakeClock) -> None:
    issued = issue_token(name="ci", scope="read")
    row = ApiToken.objects.get(name="ci")
    assert issued.secret.startswith("da_")
    assert len(issued.secret) >= 40
    assert row.digest == digest(issued.secret) != issued.secret
    assert issued.secret not in {row.digest, row.prefix}
    assert issued.secret.startswith(row.prefix)
    assert (row.scope, row.created_at, row.revoked_at) == ("read", clock.now(), None)


def test_tokens__last_used_is_written_at_most_once_a_minute(
    client: TestClient, clock: FakeClock
) -> None:
    secret = issue_token(name="ci", scope="read").secret
    client.get("/health", headers=bearer(secret))
    first = clock.now()
    clock.advance(seconds=30)
    client.get("/health", headers=bearer(secret))
    assert ApiToken.objects.get().last_used_at == first
    clock.advance(seconds=31)
    client.get("/health", headers=bearer(secret))
    assert ApiToken.objects.get().last_used_at == first + timedelta(seconds=61)


# -- sessions need the admin's model permissions ---------------------------------------------


def test_auth__a_session_without_view_submission_never_sees_a_payload(clock: FakeClock) -> None:
    """The finding: a staff user the admin refuses read payloads through the API."""
    row = SubmissionFactory(payload={"card": "4111-secret"}, result={"token": "r-secret"})
    make_user("staffer", perms=["view_host", "view_thread"])
    web = Client()
    assert web.login(username="staffer", password="pw")
    assert web.get(f"/admin/durable_agent/submission/{row.pk}/change/").status_code == 403

    response = web.get(f"/api/durable-agent/submissions/{row.pk}")
    body = assert_error(response, 403, "insufficient_scope")
    assert body["detail"] == {
        "permissions": ["durable_agent.view_submission", "durable_agent.change_submission"]
    }
    assert b"secret" not in response.content

    make_user("auditor", perms=["view_submission"])
    assert web.login(username="auditor", password="pw")
    response = web.get(f"/api/durable-agent/submissions/{row.pk}")
    assert response.status_code == 200
    assert response.json()["payload"] == {"card": "4111-secret"}


def _read_paths(host: Host) -> dict[str, str]:
    row = SubmissionFactory(thread__host=host)
    DueLaneFactory(host=host, lane="outbox")
    AlarmAuditFactory(host=host)
    return {
        "hosts": "/hosts",
        "host": f"/hosts/{host.key}",
        "lanes": f"/hosts/{host.key}/lanes",
        "audit": f"/hosts/{host.key}/audit",
        "health": "/health",
        "submission": f"/submissions/{row.pk}",
    }


@pytest.mark.parametrize(
    ("endpoint", "refused", "allowed"),
    [
        ("hosts", ["view_submission", "view_duelane"], ["view_host"]),
        ("host", ["view_duelane", "view_alarmaudit", "view_submission"], ["change_host"]),
        ("lanes", ["view_alarmaudit", "view_submission"], ["view_duelane"]),
        ("lanes", [], ["view_host"]),
        ("audit", ["view_duelane", "view_passrecord"], ["view_alarmaudit"]),
        ("audit", [], ["view_host"]),
        ("health", ["view_submission", "view_duelane"], ["view_host"]),
        ("submission", ["view_host", "view_thread"], ["view_submission"]),
        ("submission", [], ["change_submission"]),
    ],
)
def test_auth__session_reads_need_the_permission_the_admin_asks(
    client: TestClient,
    host: Host,
    clock: FakeClock,
    read_auth: dict[str, str],
    endpoint: str,
    refused: list[str],
    allowed: list[str],
) -> None:
    path = _read_paths(host)[endpoint]
    for n, perms in enumerate([[], refused]):
        user = make_user(f"refused-{n}", perms=perms)
        body = assert_error(client.get(path, user=user), 403, "insufficient_scope")
        assert body["detail"]["permissions"], body
    assert client.get(path, user=make_user("allowed", perms=allowed)).status_code == 200
    superuser = make_user("root")
    superuser.is_superuser = True
    assert client.get(path, user=superuser).status_code == 200
    # tokens keep their scopes: a read token reads everything
    assert client.get(path, headers=read_auth).status_code == 200


def test_auth__session_repairs_need_repair_host_and_the_list_the_admin_runs_them_from(
    client: TestClient, host: Host, clock: FakeClock
) -> None:
    DueLaneFactory(host=host, lane="outbox", state="parked", stalls=8, due_at=None)
    unpark = f"/hosts/{host.key}/lanes/outbox/unpark"
    for user in [
        make_user("viewer", perms=["view_duelane", "view_host"]),  # no repair_host
        make_user("blind-operator", repair=True, perms=["view_submission"]),  # no lane list
    ]:
        assert_error(client.post(unpark, json={}, user=user), 403, "insufficient_scope")
    assert not AlarmAudit.objects.exists()
    assert DueLane.objects.get(host=host, lane="outbox").state == "parked"
    operator = make_user("lane-operator", repair=True, perms=["view_duelane"])
    assert client.post(unpark, json={}, user=operator).status_code == 200
    assert AlarmAudit.objects.get().actor == "lane-operator"

    row = SubmissionFactory(thread__host=host)
    abort = f"/submissions/{row.pk}/abort"
    host_operator = make_user("host-operator", repair=True, perms=["view_host"])
    assert_error(client.post(abort, user=host_operator), 403, "insufficient_scope")
    assert Submission.objects.get(pk=row.pk).state == "ready"
    ledger_operator = make_user("ledger-operator", repair=True, perms=["view_submission"])
    response = client.post(abort, user=ledger_operator)
    assert response.status_code == 200
    assert response.json()["state"] == "settled"


def test_auth__every_operation_has_its_session_permissions() -> None:
    operations = {
        operation["operationId"]
        for methods in openapi_document()["paths"].values()
        for operation in methods.values()
    }
    assert operations == set(SESSION_PERMISSIONS)
    for needed in SESSION_PERMISSIONS.values():
        assert all(name.startswith("durable_agent.") for name in needed), needed


def test_auth__an_operation_the_table_does_not_know_is_refused_to_sessions(
    clock: FakeClock,
) -> None:
    root = make_user("root")
    root.is_superuser = True
    request = RequestFactory().get("/")
    request.user = root
    assert StaffSessionAuth().for_operation("get_submission")(request).user == root
    for scheme in [StaffSessionAuth(), StaffSessionAuth().for_operation("new_endpoint")]:
        with pytest.raises(ApiError) as refused:
            scheme(request)
        assert (refused.value.status, refused.value.code) == (403, "insufficient_scope")


# -- refused tokens are logged and limited per client address --------------------------------


@pytest.fixture
def limit_3(settings: Any) -> None:
    settings.DURABLE_AGENT = {**settings.DURABLE_AGENT, "API_AUTH_FAILURES_PER_MINUTE": 3}


def at(address: str) -> dict[str, Any]:
    return {"META": {"REMOTE_ADDR": address}}


def test_auth__a_refused_token_is_logged_with_the_address_and_reason_never_the_secret(
    client: TestClient, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="durable_agent.api")
    revoked = issue_token(name="old-ci", scope="read").secret
    revoke_token(name="old-ci")
    guess = "da_" + "Q7x" * 14
    for secret in [guess, revoked, "da_" + "é" * 10, ""]:
        client.get("/health", headers=bearer(secret), **at("203.0.113.9"))
    failed = [r for r in caplog.records if getattr(r, "action", "") == "api_auth_failed"]
    assert [r.getMessage() for r in failed] == [
        "API token authentication failed from 203.0.113.9: unknown token",
        "API token authentication failed from 203.0.113.9: revoked token 'old-ci'",
        "API token authentication failed from 203.0.113.9: malformed token",
        "API token authentication failed from 203.0.113.9: empty token",
    ]
    assert {(r.client, r.levelname) for r in failed} == {("203.0.113.9", "WARNING")}  # type: ignore[attr-defined]
    logged = caplog.text + repr([r.__dict__ for r in caplog.records])
    for secret in [guess, revoked]:
        assert secret[3:9] not in logged  # not even a prefix of the random part


def test_auth__refused_tokens_are_limited_per_address_with_retry_after(
    client: TestClient, clock: FakeClock, limit_3: None, caplog: pytest.LogCaptureFixture
) -> None:
    good = bearer(issue_token(name="ci", scope="read").secret)
    clock.advance(seconds=15)
    for _ in range(3):
        assert_error(
            client.get("/health", headers=bearer("da_guess"), **at("198.51.100.7")),
            401,
            "invalid_token",
        )
    for headers in [bearer("da_guess"), good]:  # even a good token: checked before any lookup
        response = client.get("/health", headers=headers, **at("198.51.100.7"))
        body = assert_error(response, 429, "throttled")
        assert response["Retry-After"] == "45"
        assert body["detail"] == {"retry_after": 45}
    refusals = [r for r in caplog.records if getattr(r, "action", "") == "api_auth_throttled"]
    assert len(refusals) == 1  # once per address and minute, not once per request
    assert "198.51.100.7" in refusals[0].getMessage()

    # another address, and sessions from this one, are not affected
    assert client.get("/health", headers=good, **at("198.51.100.8")).status_code == 200
    viewer = make_user("viewer", perms=["view_host"])
    assert client.get("/health", user=viewer, **at("198.51.100.7")).status_code == 200

    clock.advance(seconds=44)
    assert client.get("/health", headers=good, **at("198.51.100.7")).status_code == 429
    clock.advance(seconds=1)  # the next minute
    assert client.get("/health", headers=good, **at("198.51.100.7")).status_code == 200


def test_auth__the_default_limit_is_20_refused_tokens_a_minute(
    client: TestClient, clock: FakeClock
) -> None:
    statuses = [
        client.get("/health", headers=bearer(f"da_guess{n}")).status_code for n in range(21)
    ]
    assert statuses == [401] * 20 + [429]


def test_auth__zero_turns_the_limit_off(
    client: TestClient, clock: FakeClock, settings: Any
) -> None:
    settings.DURABLE_AGENT = {**settings.DURABLE_AGENT, "API_AUTH_FAILURES_PER_MINUTE": 0}
    statuses = {client.get("/health", headers=bearer("da_guess")).status_code for _ in range(30)}
    assert statuses == {401}


def test_auth__x_forwarded_for_counts_only_from_trusted_proxies(
    client: TestClient, clock: FakeClock, limit_3: None, settings: Any
) -> None:
    def guess(forwarded: str, peer: str = "10.0.0.1") -> int:
        meta = {"REMOTE_ADDR": peer, "HTTP_X_FORWARDED_FOR": forwarded}
        return client.get("/health", headers=bearer("da_guess"), META=meta).status_code

    # the header is the client's to forge: without trusted proxies the peer's address counts
    assert [guess(f"192.0.2.{n}") for n in range(4)] == [401, 401, 401, 429]
    # django-ninja's NINJA_NUM_PROXIES trusts the header from anyone: it is not used
    settings.NINJA_NUM_PROXIES = 1
    assert guess("192.0.2.60", peer="10.0.0.1") == 429
    settings.DURABLE_AGENT = {**settings.DURABLE_AGENT, "API_TRUSTED_PROXIES": ["10.0.0.0/24"]}
    # behind a trusted proxy: the rightmost hop that is not a trusted proxy
    assert [guess("192.0.2.50, 10.0.0.7") for _ in range(4)] == [401, 401, 401, 429]
    assert guess("192.0.2.50, 192.0.2.51") == 401
    # a peer that is not a trusted proxy cannot pick its address, nor lock out another one
    assert guess("192.0.2.52", peer="203.0.113.5") == 401
    assert [guess("192.0.2.70", peer="203.0.113.5") for _ in range(3)] == [401, 401, 429]
    assert guess("192.0.2.70") == 401


def test_auth__trusted_proxies_must_be_addresses_or_networks(settings: Any) -> None:
    settings.DURABLE_AGENT = {"API_TRUSTED_PROXIES": ["10.0.0.0/8", "::1", "proxy.local"]}
    assert [e.id for e in check_settings()] == ["durable_agent.E012"]


def test_auth__the_limit_fails_open_when_the_cache_fails(
    client: TestClient,
    clock: FakeClock,
    limit_3: None,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = bearer(issue_token(name="ci", scope="read").secret)
    monkeypatch.setattr(failures, "_cache_error_logged", False, raising=False)
    caplog.set_level(logging.WARNING, logger="durable_agent.api")
    down_redis = {  # a Redis that is down: nothing listens on port 1
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    with override_settings(CACHES=down_redis):
        for _ in range(5):
            assert client.get("/health", headers=good, **at("198.51.100.7")).status_code == 200
            assert_error(
                client.get("/health", headers=bearer("da_guess"), **at("198.51.100.7")),
                401,
                "invalid_token",
            )
    down = [r for r in caplog.records if getattr(r, "action", "") == "api_auth_limit_off"]
    assert len(down) == 1  # once per process, not once per request
    assert down[0].levelname == "ERROR"
    assert "refused API tokens are not limited while it fails" in down[0].getMessage()
    refused = [r for r in caplog.records if getattr(r, "action", "") == "api_auth_failed"]
    assert len(refused) == 5  # each refused token is still logged
