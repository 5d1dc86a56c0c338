from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import durable_agent
from durable_agent.agents import attempts, leases, registry, transitions
from durable_agent.agents.context import AgentContext, ApprovalRequested
from durable_agent.agents.errors import LeaseLost, TransactionMisuse
from durable_agent.agents.runtime import ReferenceRuntime
from durable_agent.errors import BindingUnavailable, InvalidInput
from durable_agent.maintenance import gate
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.models import DueLane, Host, Submission, SubmissionOutcome, SubmissionState
from durable_agent.runtime import Runtime, Settlement, WorkItem, get_runtime
from durable_agent.testing import FakeClock
from tests.agents.conftest import generation, later
from tests.factories import T0, HostFactory, SubmissionFactory, ThreadFactory

pytestmark = pytest.mark.django_db


def submit(host: Host, thread: str = "t", agent: str = "echo", payload: Any = None) -> int:
    return durable_agent.submit(
        host=host, thread=thread, agent=agent, payload=payload
    ).submission_id


def row(pk: int) -> Submission:
    return Submission.objects.get(pk=pk)


# -- the protocol ---------------------------------------------------------------------------


def test_reference_runtime__is_the_default_runtime() -> None:
    assert isinstance(ReferenceRuntime(), Runtime)
    assert isinstance(get_runtime(), ReferenceRuntime)


def test_binding_registry_key__is_the_registrys(reference: ReferenceRuntime, echo: Any) -> None:
    assert reference.binding_registry_key() == registry.registry_key()


def test_scan_nonterminal__fifo_per_thread_by_thread_key(
    host: Host, clock: FakeClock, echo: Any, reference: ReferenceRuntime
) -> None:
    b1, a1, b2, a2 = (submit(host, t) for t in ["b", "a", "b", "a"])
    settled = submit(host, "c")
    Submission.objects.filter(pk=settled).update(
        state=SubmissionState.SETTLED, outcome=SubmissionOutcome.COMPLETED, settled_at=T0
    )
    Submission.objects.filter(pk=b1).update(state=SubmissionState.SUSPENDED, approval_reason="?")
    Submission.objects.filter(pk=a2).update(abort_requested_at=T0)
    submit(HostFactory(), "a")  # another host

    # Only a ready submission without an abort intent is beyond recovery's reach.
    assert reference.scan_nonterminal(host) == [
        WorkItem("a", str(a1), "ready", recoverable=False),
        WorkItem("a", str(a2), "ready", recoverable=True),
        WorkItem("b", str(b1), "suspended", recoverable=True),
        WorkItem("b", str(b2), "ready", recoverable=False),
    ]


def test_scan_nonterminal__empty_host(host: Host, reference: ReferenceRuntime) -> None:
    assert reference.scan_nonterminal(host) == []


def dirty(host: Host) -> int:
    found = generation(host)
    assert found is not None
    return found[0]


def test_scan_nonterminal_with_generation__the_scan_and_the_generation(
    host: Host, clock: FakeClock, echo: Any, reference: ReferenceRuntime
) -> None:
    # Note [The checkpoint's scan reads its generation]: the same items as the scan, with
    # the generation, in one statement.
    for t in ["b", "a", "b", "a", "c"]:
        submit(host, t)
    Submission.objects.filter(host=host, thread__key="c").update(
        state=SubmissionState.SETTLED, outcome=SubmissionOutcome.COMPLETED, settled_at=T0
    )
    Submission.objects.filter(host=host, thread__key="b").update(abort_requested_at=T0)
    submit(HostFactory(), "a")  # another host

    with CaptureQueriesContext(connection) as queries:
        both = reference.scan_nonterminal_with_generation(host)

    assert len(queries.captured_queries) == 1
    assert both == (reference.scan_nonterminal(host), dirty(host))
    assert both is not None
    assert len(both[0]) == 4


def test_scan_nonterminal_with_generation__a_host_with_nothing_open(
    clock: FakeClock, echo: Any, reference: ReferenceRuntime
) -> None:
    host = HostFactory()
    assert reference.scan_nonterminal_with_generation(host) is None  # no state row yet
    done = submit(host, "t")
    Submission.objects.filter(pk=done).update(
        state=SubmissionState.SETTLED, outcome=SubmissionOutcome.COMPLETED, settled_at=T0
    )
    assert reference.scan_nonterminal_with_generation(host) == ([], dirty(host))


def test_read_abort_intent__only_for_ready_submissions(
    host: Host, clock: FakeClock, echo: Any, reference: ReferenceRuntime
) -> None:
    ready, running = submit(host, "a"), submit(host, "b")
    Submission.objects.filter(pk=ready).update(abort_requested_at=T0)
    Submission.objects.filter(pk=running).update(
        state=SubmissionState.RUNNING, lease_owner="w", lease_expires_at=later(clock)
    )
    durable_agent.abort(running)

    assert reference.read_abort_intent(host, str(ready)) == T0
    assert reference.read_abort_intent(host, str(running)) is None
    assert reference.read_abort_intent(HostFactory(), str(ready)) is None
    assert reference.read_abort_intent(host, "not-an-id") is None
    assert reference.read_abort_intent(host, "987654") is None


# -- process_thread_head --------------------------------------------------------------------


def test_process_thread_head__claims_runs_and_settles_completed(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    seen: list[AgentContext] = []

    @registry.agent("echo")
    def echo(ctx: AgentContext, payload: Any) -> Any:
        current = row(ctx.submission.pk)
        seen.append(ctx)
        assert (current.state, current.lease_owner) == ("running", ctx.submission.lease_owner)
        assert current.lease_expires_at == T0 + timedelta(seconds=2) + leases.lease_ttl()
        return {"echo": payload}

    pk = submit(host, payload={"n": 1})
    deadline = later(clock)
    clock.advance(seconds=2)

    settlement = reference.process_thread_head(host, "t", deadline)

    assert settlement == Settlement("t", str(pk), "completed")
    done = row(pk)
    assert (done.state, done.outcome, done.result, done.error) == (
        "settled",
        "completed",
        {"echo": {"n": 1}},
        None,
    )
    assert (done.attempts, done.lease_owner, done.lease_expires_at) == (1, None, None)
    assert done.settled_at == done.updated_at == clock.now()
    ctx = seen[0]
    assert (ctx.deadline, ctx.thread, ctx.attempt, ctx.approved) == (deadline, "t", 1, False)
    assert ctx.now() == clock.now()


def test_process_thread_head__settlement_is_native_progress(
    host: Host, clock: FakeClock, echo: Any, reference: ReferenceRuntime
) -> None:
    submit(host)
    before = generation(host)
    clock.advance(seconds=1)

    with gate.native_source():
        reference.process_thread_head(host, "t", later(clock))

    assert generation(host) == before  # the pass's own work does not advance dirty
    assert DueLane.objects.get(host=host, lane=NATIVE).due_at == clock.now()


def test_process_thread_head__outside_a_pass_the_settlement_advances_the_generation(
    host: Host, clock: FakeClock, echo: Any, reference: ReferenceRuntime
) -> None:
    submit(host)
    before = generation(host)
    assert before is not None

    reference.process_thread_head(host, "t", later(clock))

    assert generation(host) == (before[0] + 1, before[1])


def test_process_thread_head__agent_exception_settles_failed(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    @registry.agent("echo")
    def boom(ctx: AgentContext, payload: Any) -> Any:
        raise ValueError("bad input " + str(payload))

    pk = submit(host, payload=3)

    settlement = reference.process_thread_head(host, "t", later(clock))

    assert settlement == Settlement("t", str(pk), "failed")
    assert (row(pk).outcome, row(pk).error, row(pk).result) == (
        "failed",
        {"type": "ValueError", "message": "bad input 3"},
        None,
    )


def test_process_thread_head__unserialisable_result_settles_failed(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    registry.register("echo", lambda ctx, payload: {"when": object()})
    pk = submit(host)

    assert reference.process_thread_head(host, "t", later(clock)) == Settlement(
        "t", str(pk), "failed"
    )
    assert row(pk).error["type"] == "InvalidPayload"
    assert "result is not JSON-serialisable" in row(pk).error["message"]


def test_process_thread_head__runs_only_the_head_fifo(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any], reference: ReferenceRuntime
) -> None:
    first, second = submit(host, payload=1), submit(host, payload=2)

    assert reference.process_thread_head(host, "t", later(clock)) == Settlement(
        "t", str(first), "completed"
    )
    assert row(second).state == SubmissionState.READY
    assert reference.process_thread_head(host, "t", later(clock)) == Settlement(
        "t", str(second), "completed"
    )
    assert reference.process_thread_head(host, "t", later(clock)) is None
    assert calls == [("echo", 1), ("echo", 2)]


@pytest.mark.parametrize(
    ("state", "fields"),
    [
        (SubmissionState.RUNNING, {"lease_owner": "other", "lease_expires_at": T0}),
        (SubmissionState.SUSPENDED, {"approval_reason": "?"}),
    ],
)
def test_process_thread_head__head_not_ready_blocks_the_thread(
    host: Host,
    clock: FakeClock,
    echo: Any,
    calls: list[Any],
    reference: ReferenceRuntime,
    state: SubmissionState,
    fields: dict[str, Any],
) -> None:
    head, follower = submit(host), submit(host)
    Submission.objects.filter(pk=head).update(state=state, **fields)

    assert reference.process_thread_head(host, "t", later(clock)) is None
    assert row(follower).state == SubmissionState.READY
    assert calls == []


def test_process_thread_head__an_unknown_head_is_skipped(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any], reference: ReferenceRuntime
) -> None:
    """An ``unknown`` submission does not hold up its thread: the next one is the head and
    runs, as the pass picks it (docs/pass.md, "Stable waits and what ends them")."""
    head, follower = submit(host, payload=1), submit(host, payload=2)
    Submission.objects.filter(pk=head).update(state=SubmissionState.UNKNOWN)

    assert reference.process_thread_head(host, "t", later(clock)) == Settlement(
        "t", str(follower), "completed"
    )
    assert row(head).state == SubmissionState.UNKNOWN
    assert calls == [("echo", 2)]
    items = reference.scan_nonterminal(host)
    assert [(i.submission, i.state, i.holds_thread) for i in items] == [
        (str(head), "unknown", False)
    ]


def test_process_thread_head__a_strict_order_unknown_head_blocks_the_thread(
    host: Host, clock: FakeClock, calls: list[Any], reference: ReferenceRuntime
) -> None:
    """``strict_order=True`` keeps strict FIFO behind an unknown outcome of that agent."""
    registry.register("echo", lambda ctx, payload: calls.append(payload), strict_order=True)
    head, follower = submit(host, payload=1), submit(host, payload=2)
    Submission.objects.filter(pk=head).update(state=SubmissionState.UNKNOWN)

    assert reference.process_thread_head(host, "t", later(clock)) is None
    assert row(follower).state == SubmissionState.READY
    assert calls == []
    items = reference.scan_nonterminal(host)
    assert [(i.state, i.holds_thread) for i in items] == [("unknown", True), ("ready", False)]


def test_process_thread_head__no_such_thread(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    assert reference.process_thread_head(host, "nothing", later(clock)) is None


def test_process_thread_head__ready_head_with_abort_intent_is_left_to_recovery(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any], reference: ReferenceRuntime
) -> None:
    pk = submit(host)
    Submission.objects.filter(pk=pk).update(abort_requested_at=T0)

    assert reference.process_thread_head(host, "t", later(clock)) is None
    assert (row(pk).state, row(pk).attempts, calls) == ("ready", 0, [])


def test_process_thread_head__missing_binding_raises_and_leaves_it_ready(
    host: Host, clock: FakeClock, echo: Any, reference: ReferenceRuntime
) -> None:
    pk = submit(host)
    registry.unregister("echo", "1")

    with pytest.raises(BindingUnavailable) as caught:
        reference.process_thread_head(host, "t", later(clock))

    assert caught.value.submission == str(pk)  # type: ignore[attr-defined]
    assert "'echo' version '1'" in str(caught.value)
    assert (row(pk).state, row(pk).attempts, row(pk).lease_owner) == ("ready", 0, None)


def test_process_thread_head__refuses_to_run_agents_inside_a_transaction(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any], reference: ReferenceRuntime
) -> None:
    submit(host)

    with pytest.raises(TransactionMisuse), transaction.atomic():
        reference.process_thread_head(host, "t", later(clock))
    assert calls == []


def test_process_thread_head__lost_lease_is_never_overwritten(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    @registry.agent("echo")
    def stolen(ctx: AgentContext, payload: Any) -> Any:
        # recovery took the submission back and another attempt claimed it meanwhile
        Submission.objects.filter(pk=ctx.submission.pk).update(lease_owner="thief")
        return "late"

    pk = submit(host)
    before = generation(host)

    assert reference.process_thread_head(host, "t", later(clock)) is None
    assert (row(pk).state, row(pk).lease_owner, row(pk).result) == ("running", "thief", None)
    assert generation(host) == before


@pytest.mark.parametrize("abort", [False, True])
def test_process_thread_head__a_completed_attempt_settles_without_reading_its_row(
    host: Host,
    clock: FakeClock,
    reference: ReferenceRuntime,
    monkeypatch: pytest.MonkeyPatch,
    abort: bool,
) -> None:
    # Note [A completed attempt settles in one statement]: the row is read (locked) only when
    # the settling UPDATE wrote nothing, here because an abort was asked for meanwhile.
    owned = attempts._owned
    reads: list[int] = []

    def spy(submission: Submission, owner: str) -> Submission | None:
        reads.append(submission.pk)
        return owned(submission, owner)

    monkeypatch.setattr(attempts, "_owned", spy)

    @registry.agent("echo")
    def done(ctx: AgentContext, payload: Any) -> Any:
        if abort:
            durable_agent.abort(ctx.submission.pk)
        return "done"

    pk = submit(host)

    settlement = reference.process_thread_head(host, "t", later(clock))

    outcome = "aborted" if abort else "completed"
    assert settlement is not None
    assert settlement.outcome == outcome
    assert reads == ([pk] if abort else [])
    assert (row(pk).state, row(pk).outcome, row(pk).lease_owner) == ("settled", outcome, None)
    assert row(pk).result == "done"


def test_claim__a_second_claim_loses(host: Host, clock: FakeClock, echo: Any) -> None:
    pk = submit(host)

    assert leases.claim(pk, "one", clock.now()) is True
    assert leases.claim(pk, "two", clock.now()) is False
    assert row(pk).lease_owner == "one"
    assert row(pk).attempts == 1


def test_renew__pushes_the_lease_only_for_its_owner(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    pk = submit(host)
    leases.claim(pk, "one", clock.now())
    clock.advance(seconds=20)

    assert leases.renew(pk, "two") is False
    assert leases.renew(pk, "one") is True
    assert row(pk).lease_expires_at == clock.now() + leases.lease_ttl()


# -- the agent context ----------------------------------------------------------------------


def test_suspend_for_approval__suspends_without_settling(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    @registry.agent("echo")
    def careful(ctx: AgentContext, payload: Any) -> Any:
        try:
            ctx.suspend_for_approval("pay 10 EUR?")
        except Exception:  # pragma: no cover - must not catch the suspension
            return "swallowed"
        return "paid"

    pk = submit(host)
    follower = submit(host)

    assert reference.process_thread_head(host, "t", later(clock)) is None
    suspended = row(pk)
    assert (suspended.state, suspended.approval_reason, suspended.outcome) == (
        "suspended",
        "pay 10 EUR?",
        None,
    )
    assert (suspended.lease_owner, suspended.approved_at, suspended.approvals) == (None, None, [])
    assert reference.process_thread_head(host, "t", later(clock)) is None  # head waits
    assert row(follower).state == SubmissionState.READY


def test_suspend_for_approval__approved_run_sees_the_approval(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    seen: list[tuple[bool, int]] = []

    @registry.agent("echo")
    def careful(ctx: AgentContext, payload: Any) -> Any:
        seen.append((ctx.approved, ctx.attempt))
        ctx.suspend_for_approval("pay 10 EUR?")
        return "paid"

    pk = submit(host)
    reference.process_thread_head(host, "t", later(clock))
    durable_agent.approve(pk)

    assert reference.process_thread_head(host, "t", later(clock)) == Settlement(
        "t", str(pk), "completed"
    )
    assert seen == [(False, 1), (True, 2)]
    assert row(pk).result == "paid"


def test_suspend_for_approval__a_new_reason_asks_again(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    @registry.agent("echo")
    def two_steps(ctx: AgentContext, payload: Any) -> Any:
        ctx.suspend_for_approval("step 1")
        ctx.suspend_for_approval("step 2")
        return "done"

    pk = submit(host)
    reference.process_thread_head(host, "t", later(clock))
    durable_agent.approve(pk)
    reference.process_thread_head(host, "t", later(clock))

    assert (row(pk).state, row(pk).approval_reason, row(pk).approvals) == (
        "suspended",
        "step 2",
        ["step 1"],
    )
    durable_agent.approve(pk)
    assert reference.process_thread_head(host, "t", later(clock)) is not None
    assert (row(pk).outcome, row(pk).approvals) == ("completed", ["step 1", "step 2"])


@pytest.mark.parametrize("reason", ["", 5, "r" * 2001])
def test_suspend_for_approval__needs_a_reason(
    host: Host, clock: FakeClock, reference: ReferenceRuntime, reason: Any
) -> None:
    registry.register("echo", lambda ctx, payload: ctx.suspend_for_approval(reason))
    pk = submit(host)

    reference.process_thread_head(host, "t", later(clock))

    assert row(pk).outcome == "failed"
    assert row(pk).error["type"] == "InvalidInput"


def test_approval_requested__is_not_an_exception() -> None:
    assert not issubclass(ApprovalRequested, Exception)
    assert ApprovalRequested("why").reason == "why"


def test_cancelled__turns_true_when_the_running_submission_is_aborted(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    observed: list[bool] = []

    @registry.agent("echo")
    def long_job(ctx: AgentContext, payload: Any) -> Any:
        observed.append(ctx.cancelled())
        durable_agent.abort(ctx.submission.pk)  # as an operator would, from elsewhere
        observed.append(ctx.cancelled())
        return "partial"

    pk = submit(host)

    assert reference.process_thread_head(host, "t", later(clock)) == Settlement(
        "t", str(pk), "aborted"
    )
    assert observed == [False, True]
    assert (row(pk).outcome, row(pk).result) == ("aborted", "partial")


def test_cancelled__abort_then_raise_settles_aborted(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    @registry.agent("echo")
    def long_job(ctx: AgentContext, payload: Any) -> Any:
        durable_agent.abort(ctx.submission.pk)
        raise RuntimeError("stopped")

    pk = submit(host)

    assert reference.process_thread_head(host, "t", later(clock)) == Settlement(
        "t", str(pk), "aborted"
    )
    assert row(pk).error == {"type": "RuntimeError", "message": "stopped"}


def test_cancelled__abort_before_suspending_settles_aborted(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    @registry.agent("echo")
    def long_job(ctx: AgentContext, payload: Any) -> Any:
        durable_agent.abort(ctx.submission.pk)
        ctx.suspend_for_approval("continue?")

    pk = submit(host)

    assert reference.process_thread_head(host, "t", later(clock)) == Settlement(
        "t", str(pk), "aborted"
    )
    assert row(pk).approval_reason is None


def test_cancelled__true_after_losing_the_lease(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    observed: list[bool] = []

    @registry.agent("echo")
    def job(ctx: AgentContext, payload: Any) -> Any:
        Submission.objects.filter(pk=ctx.submission.pk).update(lease_owner="thief")
        observed.append(ctx.cancelled())

    submit(host)
    reference.process_thread_head(host, "t", later(clock))

    assert observed == [True]


def test_mark_side_effect__commits_before_the_effect(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    observed: list[bool] = []

    @registry.agent("echo")
    def pay(ctx: AgentContext, payload: Any) -> Any:
        observed.append(row(ctx.submission.pk).side_effect_marked)
        ctx.mark_side_effect()
        observed.append(row(ctx.submission.pk).side_effect_marked)
        ctx.mark_side_effect()  # idempotent
        return "paid"

    pk = submit(host)
    reference.process_thread_head(host, "t", later(clock))

    assert observed == [False, True]
    assert row(pk).side_effect_marked is True
    assert row(pk).outcome == "completed"


def test_mark_side_effect__refused_inside_a_transaction(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    @registry.agent("echo")
    def pay(ctx: AgentContext, payload: Any) -> Any:
        with transaction.atomic():
            ctx.mark_side_effect()

    pk = submit(host)
    reference.process_thread_head(host, "t", later(clock))

    assert row(pk).error["type"] == "TransactionMisuse"
    assert row(pk).side_effect_marked is False


def test_mark_side_effect__after_losing_the_lease_raises(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    raised: list[BaseException] = []

    @registry.agent("echo")
    def pay(ctx: AgentContext, payload: Any) -> Any:
        Submission.objects.filter(pk=ctx.submission.pk).update(lease_owner="thief")
        try:
            ctx.mark_side_effect()
        except LeaseLost as exc:
            raised.append(exc)
            raise

    pk = submit(host)

    assert reference.process_thread_head(host, "t", later(clock)) is None
    assert [e.code for e in raised] == ["lease_lost"]  # type: ignore[attr-defined]
    assert row(pk).side_effect_marked is False


def test_claim__resets_the_side_effect_mark_of_the_previous_attempt(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    marks: list[bool] = []

    @registry.agent("echo")
    def job(ctx: AgentContext, payload: Any) -> Any:
        marks.append(ctx.submission.side_effect_marked)

    pk = submit(host)
    Submission.objects.filter(pk=pk).update(side_effect_marked=True, attempts=1)
    reference.process_thread_head(host, "t", later(clock))

    assert marks == [False]
    assert (row(pk).side_effect_marked, row(pk).attempts) == (False, 2)


def test_agent__submitting_from_an_agent_advances_the_other_hosts_generation(
    host: Host, clock: FakeClock, echo: Any, reference: ReferenceRuntime
) -> None:
    other = HostFactory()

    @registry.agent("fan-out")
    def fan_out(ctx: AgentContext, payload: Any) -> Any:
        return durable_agent.submit(host=other, thread="x", agent="echo", payload=1).sequence

    submit(host, agent="fan-out")
    with gate.native_source():  # as the pass calls it
        reference.process_thread_head(host, "t", later(clock))

    assert generation(other) == (2, 0)  # Note [Agents run as producers]


# -- discovery ------------------------------------------------------------------------------


def test_discover_work_threads__expired_leases_and_abort_intents(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    def thread(key: str, **fields: Any) -> None:
        SubmissionFactory(thread=ThreadFactory(host=host, key=key), sequence=1, **fields)

    running = {"state": SubmissionState.RUNNING, "lease_owner": "w"}
    thread("c-expired", **running, lease_expires_at=clock.now())
    thread("a-live", **running, lease_expires_at=clock.now() + timedelta(seconds=1))
    thread("b-abort", abort_requested_at=T0)
    thread("d-unknown", state=SubmissionState.UNKNOWN)
    thread("e-ready")
    SubmissionFactory(
        thread=ThreadFactory(key="z-other-host"), **running, lease_expires_at=clock.now()
    )

    page = reference.discover_work_threads(host, None, 32)

    assert (page.threads, page.after) == (("b-abort", "c-expired"), None)


def test_discover_work_threads__pages_after_a_key(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    for key in ["t3", "t1", "t2", "t4"]:
        SubmissionFactory(thread=ThreadFactory(host=host, key=key), abort_requested_at=T0)

    first = reference.discover_work_threads(host, None, 2)
    second = reference.discover_work_threads(host, first.after, 2)
    third = reference.discover_work_threads(host, "t4", 2)

    assert (first.threads, first.after) == (("t1", "t2"), "t2")
    assert (second.threads, second.after) == (("t3", "t4"), None)
    assert (third.threads, third.after) == ((), None)


@pytest.mark.parametrize("limit", [0, -1, True, "2"])
def test_discover_work_threads__limit_must_be_positive(
    host: Host, reference: ReferenceRuntime, limit: Any
) -> None:
    with pytest.raises(InvalidInput):
        reference.discover_work_threads(host, None, limit)


def test_process_thread_head__finds_and_claims_a_runnable_head_in_one_statement(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    # Note [The head is claimed by the statement that finds it]
    seen: list[tuple[str, str, int, bool, Any]] = []

    @registry.agent("echo")
    def look(ctx: AgentContext, payload: Any) -> Any:
        s = ctx.submission
        seen.append((ctx.thread, s.state, s.attempts, s.side_effect_marked, s.lease_expires_at))
        return "done"

    first, pk = submit(host), submit(host)
    Submission.objects.filter(pk=first).update(
        **transitions.settled(SubmissionOutcome.COMPLETED, T0)
    )
    Submission.objects.filter(pk=pk).update(side_effect_marked=True, attempts=2)

    with CaptureQueriesContext(connection) as queries:
        settlement = reference.process_thread_head(host, "t", later(clock))

    assert settlement == Settlement("t", str(pk), "completed")
    assert seen == [("t", "running", 3, False, clock.now() + leases.lease_ttl())]
    before_agent = [q["sql"] for q in queries.captured_queries]
    assert before_agent[0].startswith('UPDATE "durable_agent_submission"')
    assert "RETURNING" in before_agent[0]
    assert not any(sql.startswith('SELECT "durable_agent_submission"') for sql in before_agent)
    assert not any('FROM "durable_agent_thread"' in sql for sql in before_agent[1:])


def test_process_thread_head__with_more_bindings_than_the_statement_names_reads_the_head(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any], reference: ReferenceRuntime
) -> None:
    # Note [The head is claimed by the statement that finds it]: past CLAIM_HEAD_BINDINGS the
    # attempt reads the head first, and runs it all the same.
    for i in range(leases.CLAIM_HEAD_BINDINGS):
        registry.register(f"other-{i}", lambda ctx, payload: None)
    pk = submit(host, payload="p")

    with CaptureQueriesContext(connection) as queries:
        settlement = reference.process_thread_head(host, "t", later(clock))

    assert settlement == Settlement("t", str(pk), "completed")
    assert calls == [("echo", "p")]
    assert queries.captured_queries[0]["sql"].startswith('SELECT "durable_agent_submission"')
    claims = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert not any("RETURNING" in sql for sql in claims)


@pytest.mark.parametrize("found_first", [True, False])
def test_process_thread_head__a_claim_lost_to_a_racer_runs_nothing(
    host: Host,
    clock: FakeClock,
    echo: Any,
    calls: list[Any],
    reference: ReferenceRuntime,
    monkeypatch: pytest.MonkeyPatch,
    found_first: bool,
) -> None:
    # The racer wins before the statement that finds and claims the head (Note [The head is
    # claimed by the statement that finds it]), or, when that statement is not used, between
    # the head's read and its claim.
    pk = submit(host)
    claim, claim_head = leases.claim, leases.claim_head

    def racer_first(submission_id: int, owner: str, now: Any) -> bool:
        assert claim(submission_id, "racer", now)  # another attempt wins the race
        return claim(submission_id, owner, now)

    def racer_before_the_statement(
        host_id: int, thread: str, owner: str, now: Any, **kw: Any
    ) -> Any:
        if not found_first:
            return None
        assert claim(pk, "racer", now)
        return claim_head(host_id, thread, owner, now, **kw)

    monkeypatch.setattr(leases, "claim", racer_first)
    monkeypatch.setattr(leases, "claim_head", racer_before_the_statement)

    assert reference.process_thread_head(host, "t", later(clock)) is None
    assert (row(pk).lease_owner, row(pk).attempts, calls) == ("racer", 1, [])


def test_suspend_for_approval__after_losing_the_lease_changes_nothing(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    @registry.agent("echo")
    def careful(ctx: AgentContext, payload: Any) -> Any:
        Submission.objects.filter(pk=ctx.submission.pk).update(lease_owner="thief")
        ctx.suspend_for_approval("pay?")

    pk = submit(host)

    assert reference.process_thread_head(host, "t", later(clock)) is None
    assert (row(pk).state, row(pk).approval_reason) == ("running", None)


def test_agent_context__exposes_the_approval_request(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    seen: list[tuple[str | None, bool]] = []

    @registry.agent("echo")
    def careful(ctx: AgentContext, payload: Any) -> Any:
        seen.append((ctx.approval_reason, ctx.approved))
        ctx.suspend_for_approval("pay?")

    pk = submit(host)
    reference.process_thread_head(host, "t", later(clock))
    durable_agent.approve(pk)
    reference.process_thread_head(host, "t", later(clock))

    assert seen == [(None, False), ("pay?", True)]


def test_claim_head__gives_the_claimed_row_as_the_orm_reads_it(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    # The statement's row is read back through each field's converters (Columns in
    # durable_agent/compiled.py): JSON, datetimes and booleans as the ORM gives them.
    pk = submit(host, payload={"a": [1, "x"], "b": None})
    Submission.objects.filter(pk=pk).update(not_before=clock.now())
    now = clock.now()
    head = leases.claim_head(
        host.pk, "t", "me", now, not_after=now + timedelta(seconds=1), bindings=[("echo", "1")]
    )
    assert head is not None
    stored = row(pk)
    fields = [f.attname for f in Submission._meta.concrete_fields]
    assert {f: getattr(head, f) for f in fields} == {f: getattr(stored, f) for f in fields}
    assert (head.state, head.lease_owner, head.payload) == (
        "running",
        "me",
        {"a": [1, "x"], "b": None},
    )
    assert head._state.adding is False
    assert head._state.db == stored._state.db
