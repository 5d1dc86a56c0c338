from __future__ import annotations

from datetime import timedelta

import pytest
from ninja.testing import TestClient

from durable_agent.api.tokens import digest, issue_token, revoke_token
from durable_agent.models import AlarmAudit, ApiToken, Host
from durable_agent.testing import FakeClock
from tests.api.conftest import assert_error, bearer, make_user

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
    user = make_user("admin", repair=True)
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
    viewer = make_user("viewer")
    assert client.get("/hosts", user=viewer).status_code == 200
    response = client.post(f"/hosts/{host.key}/rearm", json={"reason": "x"}, user=viewer)
    assert_error(response, 403, "insufficient_scope")

    operator = make_user("operator", repair=True)
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
