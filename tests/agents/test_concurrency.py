"""The ledger under real concurrency: lease renewal threads, racing claims and submits."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

import durable_agent
from durable_agent.agents import leases, registry
from durable_agent.agents.context import AgentContext
from durable_agent.agents.runtime import ReferenceRuntime
from durable_agent.models import Host, Submission
from durable_agent.runtime import Settlement
from durable_agent.testing import FakeClock
from tests.agents.conftest import later
from tests.threads import run_threads

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fast_renewal(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Renew every 10 ms; the event is set after the first successful renewal."""
    renewed = threading.Event()
    original = leases.renew

    def renew(submission_id: int, owner: str) -> bool:
        ok = original(submission_id, owner)
        if ok:
            renewed.set()
        return ok

    monkeypatch.setattr(leases, "renew_every", lambda: timedelta(milliseconds=10))
    monkeypatch.setattr(leases, "renew", renew)
    return renewed


def test_lease_keeper__renews_while_the_agent_runs(
    host: Host, clock: FakeClock, reference: ReferenceRuntime, fast_renewal: threading.Event
) -> None:
    expiries: list[Any] = []

    @registry.agent("slow")
    def slow(ctx: AgentContext, payload: Any) -> Any:
        clock.advance(seconds=20)
        assert fast_renewal.wait(timeout=10), "the lease was never renewed"
        current = Submission.objects.get(pk=ctx.submission.pk)
        expiries.append(current.lease_expires_at)
        return "done"

    pk = durable_agent.submit(host=host, thread="t", agent="slow", payload=None).submission_id
    claimed_at = clock.now()

    assert reference.process_thread_head(host, "t", later(clock)) == Settlement(
        "t", str(pk), "completed"
    )
    assert expiries[0] > claimed_at + leases.lease_ttl()  # pushed past the claim's expiry


def test_lease_keeper__a_lost_lease_cancels_the_agent(
    host: Host, clock: FakeClock, reference: ReferenceRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    observed: list[bool] = []
    monkeypatch.setattr(leases, "renew_every", lambda: timedelta(milliseconds=10))
    monkeypatch.setattr(leases, "renew", lambda submission_id, owner: False)

    @registry.agent("slow")
    def slow(ctx: AgentContext, payload: Any) -> Any:
        assert ctx._lost.wait(timeout=10), "the keeper never noticed"
        observed.append(ctx.cancelled())
        return "stopped"

    durable_agent.submit(host=host, thread="t", agent="slow", payload=None)
    reference.process_thread_head(host, "t", later(clock))

    assert observed == [True]


def test_lease_keeper__a_failing_renewal_is_logged_not_raised(
    host: Host,
    clock: FakeClock,
    reference: ReferenceRuntime,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    failed = threading.Event()

    def renew(submission_id: int, owner: str) -> bool:
        failed.set()
        raise RuntimeError("database went away")

    monkeypatch.setattr(leases, "renew_every", lambda: timedelta(milliseconds=10))
    monkeypatch.setattr(leases, "renew", renew)

    @registry.agent("slow")
    def slow(ctx: AgentContext, payload: Any) -> Any:
        assert failed.wait(timeout=10)
        return "done"

    pk = durable_agent.submit(host=host, thread="t", agent="slow", payload=None).submission_id

    assert reference.process_thread_head(host, "t", later(clock)) == Settlement(
        "t", str(pk), "completed"
    )
    assert any("Renewing the lease" in r.getMessage() for r in caplog.records)


@pytest.mark.postgres
def test_claim__racing_attempts_run_the_head_once(
    host: Host, clock: FakeClock, reference: ReferenceRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[int] = []
    both_read_the_head = threading.Barrier(2)
    original = leases.claim

    def claim(submission_id: int, owner: str, now: Any) -> bool:
        both_read_the_head.wait(timeout=10)  # both attempts saw a ready head
        return original(submission_id, owner, now)

    monkeypatch.setattr(leases, "claim", claim)

    @registry.agent("once")
    def once(ctx: AgentContext, payload: Any) -> Any:
        runs.append(ctx.attempt)
        return "ran"

    pk = durable_agent.submit(host=host, thread="t", agent="once", payload=None).submission_id

    results = run_threads(lambda i: reference.process_thread_head(host, "t", later(clock)), 2)

    assert sorted(results, key=str) == [None, Settlement("t", str(pk), "completed")]
    assert runs == [1]
    assert Submission.objects.get(pk=pk).attempts == 1


@pytest.mark.postgres
def test_submit__racing_submits_on_a_new_thread_get_distinct_sequences(
    host: Host, clock: FakeClock
) -> None:
    registry.register("echo", lambda ctx, payload: payload)

    receipts = run_threads(
        lambda i: durable_agent.submit(host=host, thread="new", agent="echo", payload=i), 6
    )

    assert sorted(r.sequence for r in receipts) == [1, 2, 3, 4, 5, 6]
    assert Submission.objects.filter(host=host, thread__key="new").count() == 6


@pytest.mark.postgres
def test_submit__racing_replays_of_one_key_create_one_submission(
    host: Host, clock: FakeClock
) -> None:
    registry.register("echo", lambda ctx, payload: payload)

    receipts = run_threads(
        lambda i: durable_agent.submit(
            host=host, thread="t", agent="echo", payload=1, idempotency_key="once"
        ),
        6,
    )

    assert len({r.submission_id for r in receipts}) == 1
    assert sorted(r.created for r in receipts) == [False] * 5 + [True]
    assert Submission.objects.filter(host=host).count() == 1


@pytest.mark.postgres
@pytest.mark.threads
def test_passes__attempts_in_the_pass_thread_pool_settle_fifo(host: Host, clock: FakeClock) -> None:
    from durable_agent.maintenance import alarm
    from tests.agents.conftest import drain

    ran: list[tuple[str, int]] = []
    lock = threading.Lock()

    @registry.agent("work")
    def work(ctx: AgentContext, payload: Any) -> Any:
        with lock:
            ran.append((ctx.thread, payload))
        return payload

    for n in range(3):
        for thread in ("a", "b"):
            durable_agent.submit(host=host, thread=thread, agent="work", payload=n)

    drain(host, clock)

    assert [n for t, n in ran if t == "a"] == [0, 1, 2]
    assert [n for t, n in ran if t == "b"] == [0, 1, 2]
    assert set(Submission.objects.values_list("outcome", flat=True)) == {"completed"}
    assert alarm.scheduled(host) is None
