from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from ninja.testing import TestClient

from durable_agent.api.tokens import digest
from durable_agent.models import ApiToken
from durable_agent.testing import FakeClock
from tests.api.conftest import assert_error, bearer

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("api_token", *args, stdout=out)
    return out.getvalue()


def test_api_token__create_prints_the_secret_once_and_stores_its_digest(
    clock: FakeClock, client: TestClient
) -> None:
    output = run("create", "ci", "--scope", "read")
    secret = output.strip().splitlines()[-1]
    assert secret.startswith("da_")
    token = ApiToken.objects.get(name="ci")
    assert (token.scope, token.digest) == ("read", digest(secret))
    assert secret not in run("list") + run("list", "--all", "--json")
    assert client.get("/health", headers=bearer(secret)).status_code == 200


def test_api_token__list_and_revoke(clock: FakeClock, client: TestClient) -> None:
    secret = json.loads(run("create", "ops", "--scope", "repair", "--json"))["secret"]
    run("create", "ci", "--scope", "read")
    assert [row["name"] for row in json.loads(run("list", "--json"))] == ["ci", "ops"]
    assert "ops\trepair\tda_" in run("list")

    assert "Revoked token 'ops'" in run("revoke", "ops")
    assert [row["name"] for row in json.loads(run("list", "--json"))] == ["ci"]
    [revoked] = [row for row in json.loads(run("list", "--all", "--json")) if row["name"] == "ops"]
    assert revoked["revoked_at"] == "2030-01-01T00:00:00+00:00"
    assert_error(client.get("/health", headers=bearer(secret)), 401, "invalid_token")


def test_api_token__a_name_is_never_reused_even_after_revocation(clock: FakeClock) -> None:
    run("create", "ops", "--scope", "repair")
    with pytest.raises(CommandError, match="already has this name"):
        run("create", "ops", "--scope", "read")
    run("revoke", "ops")
    # audit rows name the token token:ops: a second token may not take the name
    with pytest.raises(CommandError, match="active or revoked, already has this name"):
        run("create", "ops", "--scope", "read")
    assert ApiToken.objects.filter(name="ops").count() == 1
    run("create", "ops-2", "--scope", "read")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create", "bad name", "--scope", "read"), "token name"),
        (("revoke", "nobody"), "No active token"),
    ],
)
def test_api_token__errors_are_command_errors(
    clock: FakeClock, args: tuple[str, ...], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_api_token__an_unknown_scope_is_refused_by_the_parser(clock: FakeClock) -> None:
    with pytest.raises(CommandError, match="invalid choice"):
        run("create", "x", "--scope", "admin")


def test_api_token__a_submit_only_token(clock: FakeClock, client: TestClient) -> None:
    secret = json.loads(run("create", "producer", "--scope", "submit", "--json"))["secret"]
    assert ApiToken.objects.get(name="producer").scope == "submit"
    assert "producer\tsubmit" in run("list")
    response = client.post("/hosts/nope/rearm", json={"reason": "x"}, headers=bearer(secret))
    assert_error(response, 403, "insufficient_scope")
