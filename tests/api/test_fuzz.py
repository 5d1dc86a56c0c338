"""Property-based fuzzing of the whole API from its served OpenAPI document (Schemathesis).

Every operation gets generated requests (mostly schema-valid, some schema-invalid bodies and
queries) through the project's WSGI application, with a repair token, a read token or no
credentials; path parameters are often steered onto seeded hosts, lanes, retries, faults and
submissions so the requests reach the services. Every response goes through every check
schemathesis has, none left out: no 5xx; the status, content type, headers (``Allow``
included) and schema its operation declares; schema-valid requests accepted and schema-invalid
ones rejected; authentication not ignored; missing required headers and unsupported methods
refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.generation.meta import ParameterLocation

from durable_agent.api.hosts import encode_host_cursor
from durable_agent.api.submissions import encode_cursor
from durable_agent.api.tokens import issue_token
from durable_agent.models import Host
from durable_agent.testing import FakeClock
from tests.factories import (
    T0,
    BindingRetryFactory,
    DueLaneFactory,
    HostFactory,
    RecoveryFaultFactory,
    SubmissionFactory,
    ThreadFactory,
)

pytestmark = pytest.mark.django_db

MIN_REQUESTS = 500
EXAMPLES_PER_OPERATION = 36


@pytest.fixture
def wsgi() -> Iterator[Any]:
    """The project's WSGI application, sharing the test's transaction (as Django's test
    client does, requests must not close the connection)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def seeded(clock: FakeClock, echo: Any, settings: Any) -> dict[str, list[Any]]:
    """Objects for steered path parameters: a host with lanes, a retry, a fault, submissions.

    The refused-token limit is off: schemathesis's auth checks resend requests with bad
    tokens, all from one address in one fake minute (tests/api/test_auth.py pins the limit).
    """
    settings.DURABLE_AGENT = {**settings.DURABLE_AGENT, "API_AUTH_FAILURES_PER_MINUTE": 0}
    host: Host = HostFactory(key="fuzz")
    DueLaneFactory(host=host, lane="outbox", state="parked", stalls=8, due_at=None)
    DueLaneFactory(host=host, lane="agent:native")
    retry = BindingRetryFactory(host=host)
    RecoveryFaultFactory(host=host, thread="t1")
    thread = ThreadFactory(host=host, key="t1")
    submissions = [
        SubmissionFactory(thread=thread, sequence=1, state="unknown"),
        SubmissionFactory(thread=thread, sequence=2, state="suspended", approval_reason="ok?"),
        SubmissionFactory(thread=thread, sequence=3),
    ]
    return {
        "cursors": {
            "list_hosts": [encode_host_cursor(host.pk)],
            "list_submissions": [encode_cursor(row.pk) for row in submissions],
        },
        "key": ["fuzz"],
        "lane": ["outbox", "agent:native", "agent:custom", "missing"],
        "retry_id": [retry.pk],
        "thread": ["t1", "t/2"],
        "submission_id": [row.pk for row in submissions],
    }


def test_fuzz__no_server_errors_and_every_response_matches_its_declaration(
    wsgi: Any, seeded: dict[str, list[Any]]
) -> None:
    credentials = [
        {"Authorization": f"Bearer {issue_token(name='fuzz-ops', scope='repair').secret}"},
        {"Authorization": f"Bearer {issue_token(name='fuzz-reader', scope='read').secret}"},
        {},
        {"Authorization": f"Bearer {issue_token(name='fuzz-producer', scope='submit').secret}"},
    ]
    schema = schemathesis.openapi.from_wsgi("/api/durable-agent/openapi.json", wsgi)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 16
    sent: dict[str, int] = {}
    statuses: dict[int, int] = {}
    started = time.monotonic()

    for operation in operations:
        positive = operation.as_strategy(generation_mode=GenerationMode.POSITIVE)
        negative = operation.as_strategy(generation_mode=GenerationMode.NEGATIVE)

        @given(
            case=st.one_of(positive, positive, positive, negative),
            auth=st.sampled_from([0, 0, 0, 0, 1, 2, 3]),
            steer=st.dictionaries(
                st.sampled_from(sorted(set(seeded) - {"cursors"})), st.integers(0, 9)
            ),
            known=st.booleans(),
            echo_agent=st.booleans(),
        )
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def exercise(
            case: Any, auth: int, steer: dict[str, int], known: bool, echo_agent: bool
        ) -> None:
            # Steering never touches a part schemathesis made invalid (a negative case must
            # stay negative): an invalid path reaches the mount's JSON 404, an invalid header
            # is sent instead of the credentials.
            def negated(location: ParameterLocation) -> bool:
                info = case.meta.components.get(location)
                return info is not None and info.mode == GenerationMode.NEGATIVE

            positive_case = case.meta.generation.mode == GenerationMode.POSITIVE
            if case.path_parameters and not negated(ParameterLocation.PATH):
                path = dict(case.path_parameters)
                for name in path:
                    if known or name in steer:
                        choices = seeded[name]
                        if positive_case and name == "lane":
                            # a positive case names no lane of the reserved agent: namespace
                            # but the native lane (test_bad_input.py refuses the others)
                            choices = [c for c in choices if c != "agent:custom"]
                        path[name] = choices[steer.get(name, 0) % len(choices)]
                case.path_parameters = path
            # What the schema cannot say, a positive case keeps to: a cursor is one the
            # endpoint issued, an agent is registered, an idempotency key sent twice (body
            # and header) is the same key, a not_before is at most 366 days ahead (the
            # fixtures' clock stands at T0). Breaking these is tested in test_bad_input.py and
            # test_submissions.py.
            if positive_case and case.query and case.query.get("cursor") is not None:
                issued = seeded["cursors"][case.operation.definition.raw["operationId"]]
                cursor = issued[steer.get("submission_id", 0) % len(issued)]
                case.query = {**case.query, "cursor": cursor}
            if isinstance(case.body, dict) and not negated(ParameterLocation.BODY):
                body = dict(case.body)
                header = (case.headers or {}).get("Idempotency-Key")
                if positive_case and header is not None and body.get("idempotency_key"):
                    body["idempotency_key"] = header
                if (echo_agent or positive_case) and "agent" in body:
                    body["agent"] = "echo"
                    body.pop("version", None)
                if positive_case and body.get("not_before") is not None:
                    ahead = timedelta(hours=steer.get("submission_id", 0))
                    body["not_before"] = (T0 + ahead).isoformat()
                case.body = body
            headers = None if negated(ParameterLocation.HEADER) else credentials[auth]
            response = case.call(headers=headers)
            sent[case.operation.label] = sent.get(case.operation.label, 0) + 1
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            case.validate_response(response, headers=headers)

        exercise()

    total = sum(sent.values())
    elapsed = time.monotonic() - started
    print(f"\nfuzz: {total} requests in {elapsed:.1f} s; statuses {dict(sorted(statuses.items()))}")
    assert total >= MIN_REQUESTS, sent
    assert all(count >= 10 for count in sent.values()), sent
    assert {200, 401, 403, 404, 409, 422} <= set(statuses), statuses
