from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ninja import NinjaAPI, Router
from ninja.testing import TestClient
from ninja.throttling import BaseThrottle

import durable_agent.agents.errors
import durable_agent.api.tokens
import durable_agent.maintenance.operators.repairs
from durable_agent.api import router, selectors
from durable_agent.api.errors import STATUS_BY_CODE, ErrorContract, jsonable, status_for
from durable_agent.errors import DurableAgentError, HostNotFound, InvalidInput
from durable_agent.models import Host
from tests.api.conftest import assert_error

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
# Imported for their DurableAgentError subclasses.
ERROR_MODULES = (
    durable_agent.agents.errors,
    durable_agent.api.tokens,
    durable_agent.maintenance.operators.repairs,
)


def subclasses(cls: type[DurableAgentError]) -> set[type[DurableAgentError]]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= subclasses(sub)
    return found


def documented_statuses() -> dict[str, int]:
    """The code -> status table of docs/api.md (rows like ``| `code` | 404 | ...``)."""
    rows = re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \|", DOCS.read_text(encoding="utf-8"), re.M)
    return {code: int(status) for code, status in rows}


def test_errors__every_service_error_code_has_a_deliberate_status() -> None:
    assert ERROR_MODULES
    ours = {
        cls for cls in subclasses(DurableAgentError) if cls.__module__.startswith("durable_agent")
    }
    codes = {cls.code for cls in ours} | {DurableAgentError.code}
    missing = sorted(codes - set(STATUS_BY_CODE))
    assert not missing, f"map these codes in durable_agent/api/errors.py and docs/api.md: {missing}"


def test_errors__the_docs_table_is_the_code_table() -> None:
    assert documented_statuses() == STATUS_BY_CODE


def test_errors__status_falls_back_on_the_class() -> None:
    class Odd(InvalidInput):
        """Odd."""

        code = "odd"

    class Gone(DurableAgentError, LookupError):
        """Gone."""

        code = "gone"

    class Broken(DurableAgentError):
        """Broken."""

        code = "broken"

    assert (status_for(Odd()), status_for(Gone()), status_for(Broken())) == (422, 404, 500)
    assert status_for(HostNotFound()) == 404


def test_errors__context_becomes_plain_json() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert jsonable({"at": when, "ids": (1, 2), "obj": object, 3: None}) == {
        "at": "2030-01-01T00:00:00+00:00",
        "ids": [1, 2],
        "obj": "<class 'object'>",
        "3": None,
    }


@pytest.mark.django_db
def test_errors__an_unexpected_exception_is_a_logged_500_in_the_contract(
    client: TestClient,
    read_auth: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(**kwargs: object) -> None:
        raise ZeroDivisionError("secret internals")

    monkeypatch.setattr(selectors, "host_page", broken)
    monkeypatch.setattr("durable_agent.api.hosts.host_page", broken)
    body = assert_error(client.get("/hosts", headers=read_auth), 500, "internal_error")
    assert "secret internals" not in body["message"]
    assert "ZeroDivisionError: secret internals" in caplog.text


@pytest.mark.django_db
def test_errors__other_routers_of_the_project_keep_ninjas_shapes(host: Host) -> None:
    other = Router()

    @other.get("/other/{n}")
    def other_view(request: object, n: int) -> int:
        return n

    api = NinjaAPI(urls_namespace="errors-test")
    api.add_router("/da", router)
    api.add_router("", other)
    client = TestClient(api)

    assert client.get("/other/x").json() == {
        "detail": [
            {
                "type": "int_parsing",
                "loc": ["path", "n"],
                "msg": "Input should be a valid integer, unable to parse string as an integer",
            }
        ]
    }
    assert_error(client.get("/da/hosts"), 401, "not_authenticated")


def test_errors__the_contract_delegates_everything_else() -> None:
    api = NinjaAPI(urls_namespace="delegate-test")
    contract = ErrorContract(api)
    assert contract.renderer is api.renderer


@pytest.mark.django_db
def test_errors__a_project_throttle_answers_in_the_contract(
    read_auth: dict[str, str],
) -> None:
    class Closed(BaseThrottle):
        def allow_request(self, request: object) -> bool:
            return False

        def wait(self) -> float:
            return 3

    api = NinjaAPI(urls_namespace="throttle-test", throttle=Closed())
    api.add_router("", router)
    response = TestClient(api).get("/health", headers=read_auth)
    assert_error(response, 429, "throttled")
    assert response["Retry-After"] == "3"
