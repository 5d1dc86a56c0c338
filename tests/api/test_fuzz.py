"""Property-based fuzzing of the whole API from its served OpenAPI document (Schemathesis).

Every operation gets generated requests (mostly schema-valid, some schema-invalid bodies and
queries) through the project's WSGI application, with a repair token, a read token or no
credentials; path parameters are often steered onto seeded hosts, lanes, retries, faults and
submissions so the requests reach the services. Each response must not be a 5xx and must
match what its operation declares: the status, the content type, the headers and the schema.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from durable_agent.api.hosts import encode_host_cursor
from durable_agent.api.submissions import encode_cursor
from durable_agent.api.tokens import issue_token
from durable_agent.models import Host
from durable_agent.testing import FakeClock
from tests.factories import (
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
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


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
            # Schema-invalid path parameters would make unroutable URLs (Django's 404, outside
            # the API): negative cases always take seeded ones, and half the others do.
            known = known or case.meta.generation.mode == GenerationMode.NEGATIVE
            for name in case.path_parameters:
                if known or name in steer:
                    choices = seeded[name]
                    case.path_parameters[name] = choices[steer.get(name, 0) % len(choices)]
            positive_case = case.meta.generation.mode == GenerationMode.POSITIVE
            # What the schema cannot say, a positive case keeps to: a cursor is one the
            # endpoint issued, an agent is registered, an idempotency key sent twice (body
            # and header) is the same key. Breaking these is tested in test_bad_input.py.
            if positive_case and isinstance(case.body, dict) and case.headers:
                header = case.headers.get("Idempotency-Key")
                if header is not None and case.body.get("idempotency_key") is not None:
                    case.body["idempotency_key"] = header
            if positive_case and case.query and case.query.get("cursor") is not None:
                issued = seeded["cursors"][case.operation.definition.raw["operationId"]]
                case.query["cursor"] = issued[steer.get("submission_id", 0) % len(issued)]
            if (
                (echo_agent or positive_case)
                and isinstance(case.body, dict)
                and "agent" in case.body
            ):
                case.body["agent"] = "echo"
                case.body.pop("version", None)
            response = case.call(headers=credentials[auth])
            sent[case.operation.label] = sent.get(case.operation.label, 0) + 1
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            case.validate_response(response, headers=credentials[auth])

        exercise()

    total = sum(sent.values())
    elapsed = time.monotonic() - started
    print(f"\nfuzz: {total} requests in {elapsed:.1f} s; statuses {dict(sorted(statuses.items()))}")
    assert total >= MIN_REQUESTS, sent
    assert all(count >= 10 for count in sent.values()), sent
    assert {200, 401, 403, 404, 409, 422} <= set(statuses), statuses
