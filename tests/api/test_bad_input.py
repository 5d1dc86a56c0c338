"""Every bad input gets its documented 4xx (or a 503 for a database outage) and writes nothing.

Through Django's test client and project/urls.py: the body limit, the JSON 404 and 405 answer
before ninja, so the router alone would not show them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError, connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import Client
from django.test.utils import CaptureQueriesContext

from durable_agent.agents import services
from durable_agent.api.errors import RETRY_AFTER_SECONDS, to_api_error
from durable_agent.errors import AlarmError
from durable_agent.models import AlarmAudit, Host, PassRecord, Submission, SubmissionState
from durable_agent.testing import ScriptedRuntime
from project.api import openapi_document
from tests.api.conftest import assert_error
from tests.factories import SubmissionFactory, ThreadFactory
from tests.writes import footprint

pytestmark = pytest.mark.django_db

BASE = "/api/durable-agent"
MB = 1024 * 1024


def send(
    web: Client, method: str, path: str, auth: dict[str, str] | None, body: str | bytes = ""
) -> Any:
    extra = {"HTTP_AUTHORIZATION": auth["Authorization"]} if auth else {}
    return web.generic(method, f"{BASE}{path}", body, content_type="application/json", **extra)


@pytest.fixture
def web() -> Client:
    return Client(raise_request_exception=False)


@pytest.fixture
def suspended(host: Host) -> Submission:
    thread = ThreadFactory(host=host, key="t")
    row: Submission = SubmissionFactory(
        thread=thread, sequence=1, state=SubmissionState.SUSPENDED, approval_reason="pay?"
    )
    return row


# -- 413: an oversized body, refused unread --------------------------------------------------


@pytest.mark.parametrize("auth", ["none", "read", "repair"])
def test_bad_input__a_10_mb_body_is_413_before_authentication_and_parsing(
    web: Client,
    host: Host,
    read_auth: dict[str, str],
    repair_auth: dict[str, str],
    auth: str,
) -> None:
    headers = {"none": None, "read": read_auth, "repair": repair_auth}[auth]
    body = json.dumps({"reason": "x" * (10 * MB)})
    before = footprint()
    with CaptureQueriesContext(connection) as queries:
        response = send(web, "POST", f"/hosts/{host.key}/rearm", headers, body)
    error = assert_error(response, 413, "request_too_large")
    assert error["detail"] == {"limit": 2_621_440}  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE
    assert len(queries) == 0  # no token lookup, no host, nothing
    assert footprint() == before


def test_bad_input__the_body_limit_is_django_s_setting(
    web: Client, host: Host, repair_auth: dict[str, str], settings: Any
) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    body = json.dumps({"reason": "x" * 100})
    assert_error(
        send(web, "POST", f"/hosts/{host.key}/rearm", repair_auth, body), 413, "request_too_large"
    )
    assert not AlarmAudit.objects.exists()
    fits = json.dumps({"reason": "x" * 80})
    assert send(web, "POST", f"/hosts/{host.key}/rearm", repair_auth, fits).status_code == 200


@pytest.mark.parametrize("length", ["abc", "-1"])
def test_bad_input__an_unreadable_content_length_is_400(
    web: Client, host: Host, repair_auth: dict[str, str], length: str
) -> None:
    before = footprint()
    response = web.post(
        f"{BASE}/hosts/{host.key}/pass",
        "{}",
        content_type="application/json",
        HTTP_AUTHORIZATION=repair_auth["Authorization"],
        CONTENT_LENGTH=length,
    )
    assert_error(response, 400, "bad_request")
    assert footprint() == before


def test_bad_input__django_s_own_refusal_is_413_too(settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    error = to_api_error(RequestDataTooBig("too big"))
    assert error is not None
    assert (error.status, error.code, error.detail) == (413, "request_too_large", {"limit": 1000})


# -- 422: payloads the database cannot store -------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        '{"\\ud800": 1}',  # a lone surrogate in a key
        '{"k": "\\ud800"}',  # ... in a value
        '["ok", {"deep": ["\\udfff"]}]',  # ... nested
        '{"k\\u0000": 1}',  # a NUL in a key
        '{"k": "a\\u0000b"}',  # ... in a value
        "[" * 65 + "]" * 65,  # 65 levels
        "[" * 900 + "]" * 900,
        "[" * 5000 + "]" * 5000,  # deeper than the JSON parser reads
    ],
    ids=[
        "surrogate-key",
        "surrogate-value",
        "surrogate-nested",
        "nul-key",
        "nul-value",
        "depth-65",
        "depth-900",
        "depth-5000",
    ],
)
def test_bad_input__an_unstorable_payload_is_422_invalid_payload(
    web: Client, host: Host, echo: Any, repair_auth: dict[str, str], payload: str
) -> None:
    before = footprint()
    body = '{"agent": "echo", "payload": ' + payload + "}"
    response = send(web, "POST", f"/hosts/{host.key}/threads/t/submissions", repair_auth, body)
    assert_error(response, 422, "invalid_payload")
    assert footprint() == before


def test_bad_input__a_payload_64_levels_deep_is_accepted(
    web: Client, host: Host, echo: Any, repair_auth: dict[str, str]
) -> None:
    body = '{"agent": "echo", "payload": ' + "[" * 64 + "1" + "]" * 64 + "}"
    response = send(web, "POST", f"/hosts/{host.key}/threads/t/submissions", repair_auth, body)
    assert response.status_code == 201, response.json()


@pytest.mark.parametrize(
    "body",
    [
        '{"agent": "echo", "idempotency_key": "\\ud800"}',
        '{"agent": "echo", "idempotency_key": "a\\u0000"}',
        '{"agent": "\\ud800"}',
        '{"agent": "echo", "version": "1\\u0000"}',
    ],
)
def test_bad_input__unstorable_text_in_a_submission_is_422(
    web: Client, host: Host, echo: Any, repair_auth: dict[str, str], body: str
) -> None:
    before = footprint()
    response = send(web, "POST", f"/hosts/{host.key}/threads/t/submissions", repair_auth, body)
    assert_error(response, 422, "validation_error")
    assert footprint() == before


# -- 422: blank reasons, strict booleans, object bodies --------------------------------------


@pytest.mark.parametrize("reason", ["\u200b", "\u200b\u200b\u200b", " \ufeff\u2060 ", "\u200e\t"])
def test_bad_input__a_reason_of_format_characters_is_blank(
    web: Client, host: Host, repair_auth: dict[str, str], reason: str
) -> None:
    before = footprint()
    body = json.dumps({"reason": reason})
    response = send(web, "POST", f"/hosts/{host.key}/rearm", repair_auth, body)
    error = assert_error(response, 422, "invalid_input")
    assert "reason is required" in error["message"]
    assert footprint() == before


@pytest.mark.parametrize("at", ["12345", "1.5", "true", "[]"])
def test_bad_input__a_datetime_must_be_a_string(
    web: Client, host: Host, repair_auth: dict[str, str], at: str
) -> None:
    # pydantic alone reads a number as seconds since 1970 (the rearm set 1969-12-31)
    before = footprint()
    body = '{"reason": "why", "at": ' + at + "}"
    response = send(web, "POST", f"/hosts/{host.key}/rearm", repair_auth, body)
    assert_error(response, 422, "validation_error")
    assert footprint() == before


@pytest.mark.parametrize("reason", ["a\\u0000b", "\\ud800"])
def test_bad_input__an_unstorable_reason_is_422(
    web: Client, host: Host, repair_auth: dict[str, str], reason: str
) -> None:
    before = footprint()
    for path in ("rearm", "pass"):
        body = '{"reason": "' + reason + '"}'
        response = send(web, "POST", f"/hosts/{host.key}/{path}", repair_auth, body)
        assert_error(response, 422, "validation_error")
    assert footprint() == before


@pytest.mark.parametrize("approved", ['"yes"', '"true"', "1", "0", "null", '"false"'])
def test_bad_input__approved_is_a_json_boolean(
    web: Client, suspended: Submission, repair_auth: dict[str, str], approved: str
) -> None:
    before = footprint()
    body = '{"approved": ' + approved + "}"
    response = send(web, "POST", f"/submissions/{suspended.pk}/approve", repair_auth, body)
    error = assert_error(response, 422, "validation_error")
    assert error["detail"]["errors"][0]["loc"] == ["body", "approved"]
    assert footprint() == before
    assert Submission.objects.get(pk=suspended.pk).state == SubmissionState.SUSPENDED


@pytest.mark.parametrize("value", ["yes", "1", "on", "True"])
def test_bad_input__query_booleans_are_true_or_false(
    web: Client, host: Host, read_auth: dict[str, str], value: str
) -> None:
    response = send(web, "GET", f"/hosts?overdue={value}", read_auth)
    error = assert_error(response, 422, "validation_error")
    assert error["detail"]["errors"][0]["loc"] == ["query", "overdue"]
    assert send(web, "GET", "/hosts?overdue=false", read_auth).json()["items"][0]["key"] == host.key


OBJECT_BODIES = [
    "hosts/{key}/pass",
    "hosts/{key}/rearm",
    "hosts/{key}/lanes/outbox/unpark",
    "hosts/{key}/binding-retries/1/retry",
    "hosts/{key}/faults/t/retry",
    "hosts/{key}/threads/t/submissions",
    "submissions/{submission}/approve",
    "submissions/{submission}/resolve",
]


REQUIRED_BODIES = [
    "hosts/{key}/rearm",
    "hosts/{key}/threads/t/submissions",
    "submissions/{submission}/approve",
    "submissions/{submission}/resolve",
]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        *((path, body) for path in OBJECT_BODIES for body in ["[]", '[{"reason": "x"}]', '"x"']),
        *((path, body) for path in OBJECT_BODIES for body in ["7", "true"]),
        # an optional body may be null (the same as absent); a required one may not
        *((path, "null") for path in REQUIRED_BODIES),
    ],
)
def test_bad_input__a_body_that_is_not_an_object_is_422_and_runs_nothing(
    web: Client,
    host: Host,
    suspended: Submission,
    echo: Any,
    runtime: ScriptedRuntime,
    repair_auth: dict[str, str],
    path: str,
    body: str,
) -> None:
    runtime.submit(host, "t1", behaviour="settle")  # work a pass would settle
    before = footprint()
    url = "/" + path.format(key=host.key, submission=suspended.pk)
    response = send(web, "POST", url, repair_auth, body)
    error = assert_error(response, 422, "validation_error")
    assert error["detail"]["errors"][0]["loc"] == ["body"]
    assert footprint() == before
    assert runtime.nonterminal(host.pk) != []
    assert not PassRecord.objects.exists()


@pytest.mark.parametrize(
    ("path", "documented"),
    [
        ("hosts/{key}/pass", "hosts/{key}/pass"),
        ("hosts/{key}/lanes/outbox/unpark", "hosts/{key}/lanes/{lane}/unpark"),
        ("hosts/{key}/binding-retries/1/retry", "hosts/{key}/binding-retries/{retry_id}/retry"),
        ("hosts/{key}/faults/t/retry", "hosts/{key}/faults/{thread}/retry"),
        ("submissions/{submission}/abort", "submissions/{submission_id}/abort"),
    ],
)
def test_bad_input__an_optional_body_may_be_null_as_the_document_declares(
    web: Client,
    host: Host,
    suspended: Submission,
    repair_auth: dict[str, str],
    path: str,
    documented: str,
) -> None:
    operation = openapi_document()["paths"][f"{BASE}/{documented}"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert {"type": "null"} in schema["anyOf"]
    url = "/" + path.format(key=host.key, submission=suspended.pk)
    response = send(web, "POST", url, repair_auth, "null")
    assert response.status_code in (200, 404, 409), response.json()


# -- 404 and 405 under the mount -------------------------------------------------------------


@pytest.mark.parametrize("path", ["/nope", "/hosts/a/b/c/d", "/", "/hosts/x/rearm/more"])
def test_bad_input__an_unknown_path_under_the_mount_is_a_json_404(
    web: Client, read_auth: dict[str, str], path: str
) -> None:
    for auth in (read_auth, None):
        response = send(web, "GET", path, auth)
        assert response["Content-Type"].startswith("application/json")
        assert_error(response, 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/hosts/{key}", "GET"),
        ("POST", "/hosts/{key}", "GET"),
        ("HEAD", "/health", "GET"),
        ("GET", "/hosts/{key}/rearm", "POST"),
        ("PUT", "/hosts/{key}/threads/a/b/submissions", "POST"),
        ("PATCH", "/submissions/1", "GET"),
        ("BREW", "/hosts", "GET"),
    ],
)
def test_bad_input__a_wrong_method_is_a_json_405_with_allow(
    web: Client,
    host: Host,
    repair_auth: dict[str, str],
    method: str,
    path: str,
    allowed: str,
) -> None:
    before = footprint()
    response = send(web, method, path.format(key=host.key), repair_auth, "{}")
    assert response.status_code == 405
    assert response["Allow"] == allowed
    assert response["Content-Type"].startswith("application/json")
    if method != "HEAD":
        error = assert_error(response, 405, "method_not_allowed")
        assert error["detail"] == {"allowed": [allowed]}
    assert footprint() == before


# -- 503: the database is unreachable --------------------------------------------------------


@pytest.fixture
def database_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new query fails as if the server were unreachable (what Django raises then)."""

    def refuse(self: BaseDatabaseWrapper) -> None:
        raise OperationalError('connection to server at "127.0.0.1", port 5432 failed')

    monkeypatch.setattr(BaseDatabaseWrapper, "ensure_connection", refuse)


def test_bad_input__an_unreachable_database_is_503_with_retry_after(
    web: Client, host: Host, repair_auth: dict[str, str], database_down: None
) -> None:
    for method, path in [("GET", "/hosts"), ("POST", f"/hosts/{host.key}/pass")]:
        response = send(web, method, path, repair_auth, "{}" if method == "POST" else "")
        error = assert_error(response, 503, "database_unavailable")
        assert response["Retry-After"] == str(RETRY_AFTER_SECONDS)
        assert "5432" not in error["message"]


@pytest.mark.parametrize(
    "exc", [OperationalError("gone"), InterfaceError("connection already closed")]
)
def test_bad_input__a_database_failure_inside_a_service_is_503(
    web: Client,
    host: Host,
    echo: Any,
    repair_auth: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    exc: Exception,
) -> None:
    def fail(**kwargs: Any) -> None:
        raise AlarmError("admit submission", "the database went away") from exc

    monkeypatch.setattr(services, "submit", fail)
    body = json.dumps({"agent": "echo"})
    response = send(web, "POST", f"/hosts/{host.key}/threads/t/submissions", repair_auth, body)
    assert_error(response, 503, "database_unavailable")
    assert response["Retry-After"] == str(RETRY_AFTER_SECONDS)


def test_bad_input__other_alarm_errors_stay_500(
    web: Client,
    host: Host,
    echo: Any,
    repair_auth: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(**kwargs: Any) -> None:
        raise AlarmError("admit submission", "a bug") from ZeroDivisionError()

    monkeypatch.setattr(services, "submit", fail)
    body = json.dumps({"agent": "echo"})
    response = send(web, "POST", f"/hosts/{host.key}/threads/t/submissions", repair_auth, body)
    assert_error(response, 500, "alarm_error")
    assert "Retry-After" not in response
