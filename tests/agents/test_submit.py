from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest

import durable_agent
from durable_agent.agents import registry
from durable_agent.agents.errors import (
    AgentNotRegistered,
    IdempotencyConflict,
    InvalidIdempotencyKey,
    InvalidPayload,
    InvalidThreadKey,
    PayloadTooLarge,
)
from durable_agent.agents.services import MAX_PAYLOAD_BYTES, Receipt
from durable_agent.errors import (
    BindingUnavailable,
    DurableAgentError,
    GateMisuse,
    HostNotFound,
    InvalidInput,
)
from durable_agent.maintenance import alarm, gate
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.models import DueLane, Host, Submission, SubmissionState, Thread
from durable_agent.testing import FakeClock
from tests.agents.conftest import generation
from tests.factories import T0, HostFactory

pytestmark = pytest.mark.django_db


def footprint(host: Host) -> tuple[Any, ...]:
    """Everything a submit could write."""
    return (
        list(Thread.objects.values_list("pk", flat=True)),
        list(Submission.objects.values_list("pk", "state")),
        generation(host),
        list(DueLane.objects.filter(host=host).values_list("lane", "revision", "due_at")),
        alarm.scheduled(host),
    )


def test_submit__creates_the_thread_and_a_ready_submission(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    receipt = durable_agent.submit(
        host=host, thread="t1", agent="echo", payload={"n": 1}, idempotency_key="k1"
    )

    assert receipt == Receipt(
        submission_id=receipt.submission_id,
        thread="t1",
        sequence=1,
        idempotency_key="k1",
        created=True,
        state="ready",
    )
    row = Submission.objects.get(pk=receipt.submission_id)
    assert (row.host_id, row.thread.key, row.thread.host_id) == (host.pk, "t1", host.pk)
    assert (row.agent, row.agent_version, row.payload) == ("echo", "1", {"n": 1})
    assert (row.state, row.outcome, row.attempts) == (SubmissionState.READY, None, 0)
    assert row.created_at == row.updated_at == row.thread.created_at == T0


def test_submit__admits_through_the_gate_in_one_commit(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    durable_agent.submit(host=host, thread="t1", agent="echo", payload=None)

    assert generation(host) == (2, 0)  # a missing state row means dirty=1; +1 for the submit
    native = DueLane.objects.get(host=host, lane=NATIVE)
    assert native.due_at == T0
    assert alarm.scheduled(host) == T0 + timedelta(milliseconds=50)


def test_submit__sequences_are_fifo_per_thread(host: Host, clock: FakeClock, echo: Any) -> None:
    sequences = [
        durable_agent.submit(host=host, thread=thread, agent="echo", payload=i).sequence
        for i, thread in enumerate(["a", "b", "a", "a", "b"])
    ]

    assert sequences == [1, 1, 2, 3, 2]
    assert Thread.objects.filter(host=host).count() == 2
    assert generation(host) == (6, 0)


def test_submit__same_thread_key_on_two_hosts_is_two_threads(clock: FakeClock, echo: Any) -> None:
    one, two = HostFactory(), HostFactory()
    durable_agent.submit(host=one, thread="t", agent="echo", payload=1)
    durable_agent.submit(host=two.key, thread="t", agent="echo", payload=2)
    durable_agent.submit(host=two.pk, thread="t", agent="echo", payload=3)

    assert list(Thread.objects.order_by("host_id").values_list("host_id", "key")) == [
        (one.pk, "t"),
        (two.pk, "t"),
    ]
    assert Submission.objects.filter(host=two).count() == 2


def test_submit__replayed_key_returns_the_original_receipt_without_admitting(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    first = durable_agent.submit(
        host=host, thread="t", agent="echo", payload={"a": 1}, idempotency_key="k"
    )
    before = footprint(host)
    clock.advance(seconds=5)

    again = durable_agent.submit(
        host=host, thread="t", agent="echo", payload={"a": 1}, idempotency_key="k"
    )

    assert again == Receipt(first.submission_id, "t", 1, "k", created=False, state="ready")
    assert footprint(host) == before  # no row, no generation bump, no lane, same alarm


def test_submit__replay_reports_the_current_state(host: Host, clock: FakeClock, echo: Any) -> None:
    first = durable_agent.submit(
        host=host, thread="t", agent="echo", payload=1, idempotency_key="k"
    )
    Submission.objects.filter(pk=first.submission_id).update(state=SubmissionState.UNKNOWN)

    again = durable_agent.submit(
        host=host, thread="t", agent="echo", payload=1, idempotency_key="k"
    )

    assert (again.created, again.state) == (False, "unknown")


def test_submit__replay_with_a_different_payload_conflicts(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    durable_agent.submit(host=host, thread="t", agent="echo", payload={"a": 1}, idempotency_key="k")
    before = footprint(host)

    with pytest.raises(IdempotencyConflict) as caught:
        durable_agent.submit(
            host=host, thread="t", agent="echo", payload={"a": 2}, idempotency_key="k"
        )

    assert caught.value.code == "idempotency_conflict"
    assert footprint(host) == before


def test_submit__replay_with_another_explicit_version_conflicts(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    registry.register("echo", lambda ctx, payload: payload, version="2")
    durable_agent.submit(
        host=host, thread="t", agent="echo", version="1", payload=1, idempotency_key="k"
    )

    with pytest.raises(IdempotencyConflict):
        durable_agent.submit(
            host=host, thread="t", agent="echo", version="2", payload=1, idempotency_key="k"
        )


def test_submit__the_same_key_on_another_thread_is_new_work(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    one = durable_agent.submit(host=host, thread="a", agent="echo", payload=1, idempotency_key="k")
    two = durable_agent.submit(host=host, thread="b", agent="echo", payload=1, idempotency_key="k")

    assert one.submission_id != two.submission_id
    assert two.created is True


def test_submit__generates_an_idempotency_key(host: Host, clock: FakeClock, echo: Any) -> None:
    one = durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    two = durable_agent.submit(host=host, thread="t", agent="echo", payload=1)

    assert re.fullmatch(r"[0-9a-f]{32}", one.idempotency_key)
    assert one.idempotency_key != two.idempotency_key
    assert two.created is True


def test_submit__stores_the_payload_as_the_agent_will_see_it(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    receipt = durable_agent.submit(
        host=host, thread="t", agent="echo", payload={"pair": (1, 2), 3: "three"}
    )

    assert Submission.objects.get(pk=receipt.submission_id).payload == {
        "pair": [1, 2],
        "3": "three",
    }


def test_submit__version_none_uses_the_only_registered_version(
    host: Host, clock: FakeClock
) -> None:
    registry.register("job", lambda ctx, payload: None, version="7")

    receipt = durable_agent.submit(host=host, thread="t", agent="job", payload=None)

    assert Submission.objects.get(pk=receipt.submission_id).agent_version == "7"


def test_submit__int_version_is_accepted(host: Host, clock: FakeClock) -> None:
    registry.register("job", lambda ctx, payload: None, version="7")

    receipt = durable_agent.submit(host=host, thread="t", agent="job", payload=None, version=7)

    assert Submission.objects.get(pk=receipt.submission_id).agent_version == "7"


def test_submit__inside_gate_transaction_joins_the_callers_commit(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), gate.transaction(host):
        durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
        raise Boom

    assert not Submission.objects.exists()
    assert not Thread.objects.exists()

    with gate.transaction(host):
        durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
        durable_agent.submit(host=host, thread="t", agent="echo", payload=2)
    assert generation(host) == (3, 0)


def test_submit__inside_a_raw_atomic_block_is_refused(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    from django.db import transaction

    with pytest.raises(GateMisuse), transaction.atomic():
        durable_agent.submit(host=host, thread="t", agent="echo", payload=1)

    assert not Submission.objects.exists()


# -- bad input writes nothing ------------------------------------------------------------


BAD_INPUTS: list[tuple[str, dict[str, Any], type[DurableAgentError], str]] = [
    ("unknown agent", {"agent": "nope"}, AgentNotRegistered, "agent_not_registered"),
    ("unknown version", {"version": "9"}, AgentNotRegistered, "agent_not_registered"),
    ("agent not a string", {"agent": 5}, InvalidInput, "invalid_input"),
    ("payload object", {"payload": object()}, InvalidPayload, "invalid_payload"),
    ("payload set", {"payload": {1, 2}}, InvalidPayload, "invalid_payload"),
    ("payload nan", {"payload": float("nan")}, InvalidPayload, "invalid_payload"),
    ("payload inf", {"payload": [float("inf")]}, InvalidPayload, "invalid_payload"),
    (
        "payload too large",
        {"payload": "x" * (MAX_PAYLOAD_BYTES - 1)},
        PayloadTooLarge,
        "payload_too_large",
    ),
    ("thread empty", {"thread": ""}, InvalidThreadKey, "invalid_thread_key"),
    ("thread too long", {"thread": "t" * 257}, InvalidThreadKey, "invalid_thread_key"),
    ("thread not a string", {"thread": 7}, InvalidThreadKey, "invalid_thread_key"),
    ("key empty", {"idempotency_key": ""}, InvalidIdempotencyKey, "invalid_idempotency_key"),
    (
        "key too long",
        {"idempotency_key": "k" * 201},
        InvalidIdempotencyKey,
        "invalid_idempotency_key",
    ),
    ("key not a string", {"idempotency_key": 5}, InvalidIdempotencyKey, "invalid_idempotency_key"),
    ("host key unknown", {"host": "no-such-host"}, HostNotFound, "host_not_found"),
    ("host id unknown", {"host": 987654}, HostNotFound, "host_not_found"),
]


@pytest.mark.parametrize(
    ("case", "override", "error", "code"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS]
)
def test_submit__bad_input_raises_and_writes_nothing(
    host: Host,
    clock: FakeClock,
    echo: Any,
    case: str,
    override: dict[str, Any],
    error: type[DurableAgentError],
    code: str,
) -> None:
    durable_agent.submit(host=host, thread="existing", agent="echo", payload=0)
    before = footprint(host)
    arguments: dict[str, Any] = {"host": host, "thread": "t", "agent": "echo", "payload": 1}

    with pytest.raises(error) as caught:
        durable_agent.submit(**{**arguments, **override})

    assert caught.value.code == code
    assert isinstance(caught.value, DurableAgentError)
    assert caught.value.message
    assert footprint(host) == before


def test_submit__payload_at_the_limit_is_accepted(host: Host, clock: FakeClock, echo: Any) -> None:
    payload = "x" * (MAX_PAYLOAD_BYTES - 2)  # plus two quotes: exactly the limit

    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=payload)

    assert receipt.created is True


def test_submit__payload_size_counts_utf8_bytes(host: Host, clock: FakeClock, echo: Any) -> None:
    with pytest.raises(PayloadTooLarge) as caught:
        durable_agent.submit(
            host=host, thread="t", agent="echo", payload="é" * (MAX_PAYLOAD_BYTES // 2)
        )

    assert caught.value.size == MAX_PAYLOAD_BYTES + 2  # type: ignore[attr-defined]


def test_submit__thread_key_of_256_characters_is_accepted(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    receipt = durable_agent.submit(host=host, thread="t" * 256, agent="echo", payload=1)

    assert receipt.thread == "t" * 256


def test_submit__unknown_agent_is_also_a_binding_error_with_advice(
    host: Host, clock: FakeClock
) -> None:
    with pytest.raises(AgentNotRegistered) as caught:
        durable_agent.submit(host=host, thread="t", agent="nope", payload=1)

    assert isinstance(caught.value, BindingUnavailable)
    assert isinstance(caught.value, InvalidInput)
    assert "@durable_agent.agent('nope')" in str(caught.value)


def test_submit__several_versions_need_an_explicit_one(host: Host, clock: FakeClock) -> None:
    registry.register("job", lambda ctx, payload: 1, version="1")
    registry.register("job", lambda ctx, payload: 2, version="2")

    with pytest.raises(InvalidInput, match=r"several registered versions \(1, 2\)"):
        durable_agent.submit(host=host, thread="t", agent="job", payload=None)
    assert not Submission.objects.exists()
