"""Bad input through the Python services: a clear DurableAgentError with a stable code, and
nothing written (no raw DataError, UnicodeEncodeError or RecursionError).

On PostgreSQL the NUL cases fail the write with a DataError unless they are refused first; on
SQLite they would be stored, which is no better. Both fail without the validation.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import durable_agent
from durable_agent.agents import registry
from durable_agent.agents.errors import (
    InvalidIdempotencyKey,
    InvalidPayload,
    InvalidThreadKey,
    SubmissionNotFound,
)
from durable_agent.agents.runtime import ReferenceRuntime
from durable_agent.agents.services import MAX_PAYLOAD_DEPTH, validate_payload
from durable_agent.errors import DurableAgentError, HostNotFound, InvalidInput
from durable_agent.maintenance import alarm, repairs
from durable_agent.models import AlarmAudit, Host, Submission, SubmissionState
from durable_agent.testing import FakeClock, ScriptedRuntime
from durable_agent.text import is_blank, validate_reason
from tests.agents.conftest import later
from tests.factories import T0, RecoveryFaultFactory, SubmissionFactory, ThreadFactory
from tests.writes import footprint

pytestmark = pytest.mark.django_db


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def cyclic() -> Any:
    value: list[Any] = []
    value.append(value)
    return value


BAD_SUBMISSIONS: list[tuple[str, dict[str, Any], type[DurableAgentError], str]] = [
    ("surrogate in a payload key", {"payload": {"\ud800": 1}}, InvalidPayload, "invalid_payload"),
    ("surrogate in a payload value", {"payload": ["\udfff"]}, InvalidPayload, "invalid_payload"),
    ("NUL in a payload key", {"payload": {"k\x00": 1}}, InvalidPayload, "invalid_payload"),
    (
        "NUL in a payload value",
        {"payload": {"k": {"v": "\x00"}}},
        InvalidPayload,
        "invalid_payload",
    ),
    ("payload 65 deep", {"payload": nested(65)}, InvalidPayload, "invalid_payload"),
    ("payload 5000 deep", {"payload": nested(5000)}, InvalidPayload, "invalid_payload"),
    (
        "payload 5000 deep dicts",
        {"payload": {"a": nested(5000)}},
        InvalidPayload,
        "invalid_payload",
    ),
    ("cyclic payload", {"payload": cyclic()}, InvalidPayload, "invalid_payload"),
    ("NUL in a thread key", {"thread": "t\x00"}, InvalidThreadKey, "invalid_thread_key"),
    ("surrogate in a thread key", {"thread": "\ud800"}, InvalidThreadKey, "invalid_thread_key"),
    (
        "NUL in a key",
        {"idempotency_key": "k\x00"},
        InvalidIdempotencyKey,
        "invalid_idempotency_key",
    ),
    (
        "surrogate in a key",
        {"idempotency_key": "\udc00"},
        InvalidIdempotencyKey,
        "invalid_idempotency_key",
    ),
    ("NUL in a host key", {"host": "h\x00"}, HostNotFound, "host_not_found"),
    ("surrogate in a host key", {"host": "\ud800"}, HostNotFound, "host_not_found"),
]


@pytest.mark.parametrize(
    ("case", "override", "error", "code"), BAD_SUBMISSIONS, ids=[c[0] for c in BAD_SUBMISSIONS]
)
def test_submit__unstorable_input_raises_a_clear_error_and_writes_nothing(
    host: Host,
    clock: FakeClock,
    echo: Any,
    case: str,
    override: dict[str, Any],
    error: type[DurableAgentError],
    code: str,
) -> None:
    durable_agent.submit(host=host, thread="existing", agent="echo", payload=0)
    before = footprint()
    arguments: dict[str, Any] = {"host": host, "thread": "t", "agent": "echo", "payload": 1}

    with pytest.raises(error) as caught:
        durable_agent.submit(**{**arguments, **override})

    assert caught.value.code == code
    assert footprint() == before


def test_submit__a_payload_64_deep_is_accepted(host: Host, clock: FakeClock, echo: Any) -> None:
    assert MAX_PAYLOAD_DEPTH == 64
    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=nested(64))
    assert Submission.objects.get(pk=receipt.submission_id).payload == nested(64)


def test_validate_payload__is_what_submit_and_the_api_check() -> None:
    assert validate_payload((1, {"a": ("b",)})) == [1, {"a": ["b"]}]
    with pytest.raises(InvalidPayload, match="deeper than 64"):
        validate_payload({"k": nested(64)})
    with pytest.raises(InvalidPayload, match="lone surrogate"):
        validate_payload({"k": "ok \ud83d"})
    assert validate_payload({"k": "\U0001f600"}) == {"k": "\U0001f600"}  # a real pair is fine


def test_submit__a_wide_shared_payload_is_refused_without_walking_it_all(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    value: Any = "x"
    for _ in range(60):  # 2**60 leaves when expanded
        value = [value, value]
    with pytest.raises(DurableAgentError) as caught:
        durable_agent.submit(host=host, thread="t", agent="echo", payload=value)
    assert caught.value.code == "payload_too_large"
    assert not Submission.objects.exists()


# -- approve, abort, resolve -----------------------------------------------------------------


@pytest.fixture
def suspended(host: Host) -> Submission:
    thread = ThreadFactory(host=host, key="t")
    row: Submission = SubmissionFactory(
        thread=thread, sequence=1, state=SubmissionState.SUSPENDED, approval_reason="pay?"
    )
    return row


@pytest.mark.parametrize("approved", ["yes", 1, None, "true"])
def test_approve__approved_is_strictly_a_bool(
    suspended: Submission, clock: FakeClock, approved: Any
) -> None:
    before = footprint()
    with pytest.raises(InvalidInput):
        durable_agent.approve(suspended.pk, approved=approved)
    assert footprint() == before


@pytest.mark.parametrize("ref", ["1\x00", "\ud800", "\uff11"])
def test_submission_services__an_unstorable_reference_is_not_found(
    suspended: Submission, clock: FakeClock, ref: str
) -> None:
    before = footprint()
    for call in (
        lambda: durable_agent.abort(ref),
        lambda: durable_agent.approve(ref),
        lambda: durable_agent.resolve_unknown(ref, outcome="retry"),
    ):
        with pytest.raises(SubmissionNotFound):
            call()
    assert footprint() == before


def test_resolve_unknown__an_outcome_with_a_nul_is_invalid(
    suspended: Submission, clock: FakeClock
) -> None:
    with pytest.raises(InvalidInput):
        durable_agent.resolve_unknown(suspended.pk, outcome="retry\x00")  # type: ignore[arg-type]


# -- what agents hand back ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "fragment"),
    [({"k": "a\x00b"}, "NUL character"), (["\ud800"], "lone surrogate")],
)
def test_attempt__an_unstorable_result_settles_failed_with_invalid_payload(
    host: Host, clock: FakeClock, reference: ReferenceRuntime, result: Any, fragment: str
) -> None:
    registry.register("echo", lambda ctx, payload: result)
    pk = durable_agent.submit(host=host, thread="t", agent="echo", payload=1).submission_id

    settlement = reference.process_thread_head(host, "t", later(clock))

    assert settlement is not None
    assert settlement.outcome == "failed"
    row = Submission.objects.get(pk=pk)
    assert row.error["type"] == "InvalidPayload"
    assert fragment in row.error["message"]
    assert row.result is None


def test_attempt__an_unstorable_approval_reason_settles_failed(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    def ask(ctx: Any, payload: Any) -> None:
        ctx.suspend_for_approval("pay\x00?")

    registry.register("echo", ask)
    pk = durable_agent.submit(host=host, thread="t", agent="echo", payload=1).submission_id

    reference.process_thread_head(host, "t", later(clock))

    row = Submission.objects.get(pk=pk)
    assert (row.state, row.outcome, row.approval_reason) == ("settled", "failed", None)
    assert "NUL character" in row.error["message"]


# -- repairs, rearm and their reasons and actors ---------------------------------------------


def test_is_blank__whitespace_and_format_characters() -> None:
    assert is_blank("")
    assert is_blank(" \t\n\u00a0\u3000")
    assert is_blank("\u200b\u200c\u200d\u2060\ufeff\u200e\u00ad")
    assert not is_blank("\u200bx")
    assert validate_reason(" \u200b ") == ""
    assert validate_reason("  why  ") == "why"


REPAIRS = {
    "unpark": lambda host, **kw: repairs.lane_unpark(host=host, lane="outbox", **kw),
    "retry-binding": lambda host, **kw: repairs.binding_retry_now(host=host, retry_id=1, **kw),
    "retry-fault": lambda host, **kw: repairs.fault_retry_now(host=host, thread="t", **kw),
    "pass": lambda host, **kw: repairs.pass_now(host=host, **kw),
    "rearm": lambda host, **kw: alarm.rearm(host, **kw),
    "rearm-at": lambda host, **kw: alarm.rearm(host, at=T0, **kw),
}
BAD_ARGUMENTS = {
    "NUL reason": {"reason": "scheduler\x00down"},
    "surrogate reason": {"reason": "\ud800"},
    "NUL actor": {"actor": "ops\x00", "reason": "x"},
    "surrogate actor": {"actor": "\udfff", "reason": "x"},
    "zero-width actor": {"actor": "\u200b\u200b", "reason": "x"},
}


@pytest.mark.parametrize("arguments", BAD_ARGUMENTS.values(), ids=list(BAD_ARGUMENTS))
@pytest.mark.parametrize("repair", REPAIRS.values(), ids=list(REPAIRS))
def test_repairs__unstorable_reasons_and_actors_raise_invalid_input_and_write_nothing(
    host: Host,
    clock: FakeClock,
    runtime: ScriptedRuntime,
    repair: Any,
    arguments: dict[str, Any],
) -> None:
    RecoveryFaultFactory(host=host, thread="t", retry_at=clock.now() + timedelta(hours=1))
    before = footprint()
    with pytest.raises(InvalidInput) as caught:
        repair(host, **arguments)
    assert caught.value.code == "invalid_input"
    assert footprint() == before
    assert not AlarmAudit.objects.exists()


@pytest.mark.parametrize("thread", ["t\x00", "\ud800"])
def test_fault_retry_now__an_unstorable_thread_is_invalid_input(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, thread: str
) -> None:
    before = footprint()
    with pytest.raises(InvalidInput, match="thread key"):
        repairs.fault_retry_now(host=host, thread=thread)
    assert footprint() == before


@pytest.mark.parametrize("host_key", ["h\x00", "\ud800"])
def test_repairs__an_unstorable_host_key_is_host_not_found(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, host_key: str
) -> None:
    before = footprint()
    for repair in REPAIRS.values():
        with pytest.raises(HostNotFound):
            repair(host_key, reason="x")
    assert footprint() == before
