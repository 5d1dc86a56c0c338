"""End to end: submissions settle through alarm-driven passes alone.

Every ``drain`` fires the alarms through django-q's own scheduler and the tasks it enqueues
(``tests.qdrive``), never ``run_pass`` directly; hence ``transaction=True``.
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

import durable_agent
from durable_agent.agents import registry
from durable_agent.agents.context import AgentContext
from durable_agent.maintenance import alarm, ensure_alarm, run_pass
from durable_agent.models import BindingRetry, Host, Submission, SubmissionState
from durable_agent.testing import FakeClock
from tests.agents.conftest import generation
from tests.factories import T0
from tests.qdrive import drain_alarms

pytestmark = pytest.mark.django_db(transaction=True)


def drain(host: Host, clock: FakeClock, limit: int = 30) -> list[Any]:
    """Let django-q's scheduler fire the alarms (at each slot's time) until none is armed."""
    results = drain_alarms(clock, limit=limit * 4)
    return [
        SimpleNamespace(**{"settled": 0, "recovered": 0, "alarm": "", **result})
        for result in results
        if result.get("host") == host.key
    ]


def submit(host: Host, thread: str, payload: Any = None, agent: str = "echo") -> int:
    return durable_agent.submit(
        host=host, thread=thread, agent=agent, payload=payload
    ).submission_id


def states(*pks: int) -> list[tuple[str, str | None]]:
    rows = {r.pk: r for r in Submission.objects.filter(pk__in=pks)}
    return [(rows[pk].state, rows[pk].outcome) for pk in pks]


def assert_quiet(host: Host) -> None:
    """No alarm, and every generation acknowledged."""
    assert alarm.scheduled(host) is None
    current = generation(host)
    assert current is not None
    assert current[0] == current[1]


def crash(pk: int, *, marked: bool = False, expires_in: float = 0) -> None:
    """Make ``pk`` look like an attempt whose worker died mid-run."""
    Submission.objects.filter(pk=pk).update(
        state=SubmissionState.RUNNING,
        lease_owner="dead-worker",
        lease_expires_at=T0 + timedelta(seconds=expires_in),
        attempts=1,
        side_effect_marked=marked,
    )


def test_passes__two_threads_settle_fifo(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    a1, b1, a2, b2 = (
        submit(host, t, f"{t}{n}") for t, n in [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    )

    reports = drain(host, clock)

    assert states(a1, a2, b1, b2) == [("settled", "completed")] * 4
    order = [payload for _, payload in calls]
    assert sorted(order) == ["a1", "a2", "b1", "b2"]
    assert order.index("a1") < order.index("a2")
    assert order.index("b1") < order.index("b2")
    assert sum(r.settled for r in reports) == 4
    assert reports[-1].alarm == "cleared"
    assert_quiet(host)


def test_passes__a_later_submission_wakes_a_quiet_host(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    submit(host, "a", 1)
    drain(host, clock)
    assert_quiet(host)
    clock.advance(minutes=5)

    pk = submit(host, "a", 2)

    assert alarm.scheduled(host) == clock.now() + timedelta(milliseconds=50)
    drain(host, clock)
    assert states(pk) == [("settled", "completed")]
    assert [p for _, p in calls] == [1, 2]
    assert_quiet(host)


def test_passes__failure_settles_and_the_thread_moves_on(
    host: Host, clock: FakeClock, calls: list[Any]
) -> None:
    @registry.agent("echo")
    def picky(ctx: AgentContext, payload: Any) -> Any:
        calls.append(payload)
        if payload == "bad":
            raise ValueError("bad payload")
        return payload

    bad, good = submit(host, "a", "bad"), submit(host, "a", "good")

    drain(host, clock)

    assert states(bad, good) == [("settled", "failed"), ("settled", "completed")]
    assert calls == ["bad", "good"]
    assert_quiet(host)


def test_passes__approval_is_a_stable_wait_until_approved(
    host: Host, clock: FakeClock, calls: list[Any]
) -> None:
    @registry.agent("echo")
    def pay(ctx: AgentContext, payload: Any) -> Any:
        calls.append((payload, ctx.approved))
        if payload == "pay":
            ctx.suspend_for_approval("pay 10 EUR to ACME?")
        return payload

    payment, follower = submit(host, "a", "pay"), submit(host, "a", "next")

    drain(host, clock)
    assert states(payment, follower) == [("suspended", None), ("ready", None)]
    assert_quiet(host)  # suspended head: no alarm however much is queued behind it

    clock.advance(minutes=30)
    durable_agent.approve(payment)
    assert alarm.scheduled(host) is not None

    drain(host, clock)
    assert states(payment, follower) == [("settled", "completed"), ("settled", "completed")]
    assert calls == [("pay", False), ("pay", True), ("next", False)]
    assert_quiet(host)


def test_passes__rejection_fails_the_head_and_releases_the_thread(
    host: Host, clock: FakeClock, calls: list[Any]
) -> None:
    @registry.agent("echo")
    def pay(ctx: AgentContext, payload: Any) -> Any:
        calls.append(payload)
        if payload == "pay":
            ctx.suspend_for_approval("pay?")
        return payload

    payment, follower = submit(host, "a", "pay"), submit(host, "a", "next")
    drain(host, clock)

    durable_agent.approve(payment, approved=False)
    drain(host, clock)

    assert states(payment, follower) == [("settled", "failed"), ("settled", "completed")]
    assert calls == ["pay", "next"]
    assert_quiet(host)


def test_passes__abort_of_a_queued_head_settles_it_without_running(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    head, follower = submit(host, "a", "head"), submit(host, "a", "follower")
    durable_agent.abort(head)

    assert states(head) == [("settled", "aborted")]

    drain(host, clock)

    assert states(head, follower) == [("settled", "aborted"), ("settled", "completed")]
    assert calls == [("echo", "follower")]
    assert_quiet(host)


def test_passes__abort_of_a_running_submission_cancels_the_agent(
    host: Host, clock: FakeClock, calls: list[Any]
) -> None:
    @registry.agent("echo")
    def long_job(ctx: AgentContext, payload: Any) -> Any:
        durable_agent.abort(ctx.submission.pk)  # an operator, while the agent runs
        calls.append(ctx.cancelled())
        return "stopped early"

    pk = submit(host, "a")

    drain(host, clock)

    assert states(pk) == [("settled", "aborted")]
    assert calls == [True]
    assert_quiet(host)


def test_passes__ready_row_with_an_abort_intent_is_settled_by_recovery(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    head, follower = submit(host, "a", "head"), submit(host, "a", "follower")
    Submission.objects.filter(pk=head).update(abort_requested_at=T0)  # not via abort()

    reports = drain(host, clock)

    assert states(head, follower) == [("settled", "aborted"), ("settled", "completed")]
    assert calls == [("echo", "follower")]
    assert sum(r.recovered for r in reports) == 1
    assert_quiet(host)


def test_passes__abort_of_a_follower_behind_a_suspended_head(
    host: Host, clock: FakeClock, calls: list[Any]
) -> None:
    @registry.agent("echo")
    def wait(ctx: AgentContext, payload: Any) -> Any:
        calls.append(payload)
        ctx.suspend_for_approval("go?")

    head, follower = submit(host, "a", "head"), submit(host, "a", "follower")
    drain(host, clock)

    durable_agent.abort(follower)
    drain(host, clock)

    assert states(head, follower) == [("suspended", None), ("settled", "aborted")]
    assert calls == ["head"]
    assert_quiet(host)


def test_passes__crashed_attempt_of_a_retry_safe_agent_runs_again(
    host: Host, clock: FakeClock, calls: list[Any]
) -> None:
    @registry.agent("echo", retry_safe=True)
    def idempotent(ctx: AgentContext, payload: Any) -> Any:
        calls.append(ctx.attempt)
        return "done"

    pk = submit(host, "a")
    crash(pk, marked=True)

    drain(host, clock)

    assert states(pk) == [("settled", "completed")]
    assert calls == [2]
    assert_quiet(host)


def test_passes__crashed_attempt_after_a_side_effect_waits_as_unknown(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    pk = submit(host, "a", "charge")
    crash(pk, marked=True)

    drain(host, clock)
    assert states(pk) == [("unknown", None)]
    assert calls == []
    assert_quiet(host)  # an unknown outcome is a stable wait

    durable_agent.resolve_unknown(pk, outcome="retry")
    drain(host, clock)

    assert states(pk) == [("settled", "completed")]
    assert calls == [("echo", "charge")]
    assert_quiet(host)


def test_passes__live_lease_of_a_dead_worker_is_recovered_at_its_expiry(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    pk = submit(host, "a", "x")
    crash(pk, expires_in=30)

    first = run_pass(host)

    assert first.settled == 0
    assert states(pk) == [("running", None)]
    assert alarm.scheduled(host) == T0 + timedelta(seconds=30)  # not a polling loop
    drain(host, clock)
    assert states(pk) == [("settled", "completed")]
    assert_quiet(host)


def test_passes__missing_binding_parks_until_it_is_deployed(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    first, second = submit(host, "a", 1), submit(host, "a", 2)
    registry.unregister("echo", "1")
    registry.register("other", lambda ctx, payload: None)

    drain(host, clock)
    assert states(first, second) == [("ready", None), ("ready", None)]
    assert list(BindingRetry.objects.values_list("thread", "submission")) == [("a", str(first))]
    assert_quiet(host)

    @registry.agent("echo")
    def deployed(ctx: AgentContext, payload: Any) -> Any:
        calls.append(payload)
        return payload

    ensure_alarm(host)  # e.g. at process start: the registry key changed
    drain(host, clock)

    assert states(first, second) == [("settled", "completed"), ("settled", "completed")]
    assert calls == [1, 2]
    assert not BindingRetry.objects.exists()
    assert_quiet(host)


def test_passes__an_unknown_head_does_not_hold_up_its_thread(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    """An ``unknown`` head that recovery reported as a stable wait is skipped when the pass
    picks the thread's head: the submission behind it becomes the head and completes, and the
    host goes quiet with only the unknown outcome left, waiting for its operator (docs/pass.md,
    "Stable waits and what ends them"; docs/first-agent.md section 8)."""
    head, follower = submit(host, "a", "charge"), submit(host, "a", "next")
    crash(head, marked=True)

    drain(host, clock, limit=12)

    assert states(head, follower) == [("unknown", None), ("settled", "completed")]
    assert calls == [("echo", "next")]
    assert_quiet(host)

    later = submit(host, "a", "later")  # new input behind the same unknown outcome
    drain(host, clock, limit=12)
    assert states(head, later) == [("unknown", None), ("settled", "completed")]
    assert_quiet(host)

    durable_agent.resolve_unknown(head, outcome="retry")
    drain(host, clock)
    assert states(head) == [("settled", "completed")]
    assert calls == [("echo", "next"), ("echo", "later"), ("echo", "charge")]
    assert_quiet(host)


def test_passes__strict_order_keeps_the_thread_behind_an_unknown_head(
    host: Host, clock: FakeClock, calls: list[Any]
) -> None:
    """With ``strict_order=True`` an agent's unknown outcome holds its thread (strict FIFO, off
    by default): the follower stays ``ready`` and the host keeps no alarm until an operator
    resolves the head; then both complete in order (docs/pass.md, "Stable waits and what ends
    them")."""

    @registry.agent("echo", strict_order=True)
    def strict(ctx: AgentContext, payload: Any) -> Any:
        calls.append(payload)
        return payload

    head, follower = submit(host, "a", "charge"), submit(host, "a", "next")
    crash(head, marked=True)

    drain(host, clock, limit=12)

    assert states(head, follower) == [("unknown", None), ("ready", None)]
    assert calls == []
    assert_quiet(host)

    durable_agent.resolve_unknown(head, outcome="retry")
    drain(host, clock)
    assert states(head, follower) == [("settled", "completed"), ("settled", "completed")]
    assert calls == ["charge", "next"]
    assert_quiet(host)


def test_passes__abort_of_an_unknown_head_settles_it_and_the_follower_completes(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    """An abort of an ``unknown`` head is accepted: the head ends ``aborted`` and the
    submission behind it then completes, with no alarm left (docs/pass.md, "Stable waits and
    what ends them")."""
    head, follower = submit(host, "a", "charge"), submit(host, "a", "next")
    crash(head, marked=True)
    drain(host, clock)
    assert states(head) == [("unknown", None)]

    status = durable_agent.abort(head)

    assert (status.state, status.outcome) == ("settled", "aborted")
    drain(host, clock)
    assert states(head, follower) == [("settled", "aborted"), ("settled", "completed")]
    assert calls == [("echo", "next")]
    assert_quiet(host)


def test_passes__the_sweep_starts_a_parked_host_after_a_deploy(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    """After a deploy registers a parked head's agent, the backstop sweep (run by the broker
    once a minute) arms the parked host, and its alarm then settles the head: nothing else
    has to start the pass (docs/first-agent.md section 11, docs/pass.md "Binding parking")."""
    from durable_agent.tasks import sweep

    pk = submit(host, "a", 1)
    registry.unregister("echo", "1")
    registry.register("other", lambda ctx, payload: None)
    drain(host, clock)
    assert BindingRetry.objects.filter(submission=str(pk)).exists()
    assert_quiet(host)

    @registry.agent("echo")
    def deployed(ctx: AgentContext, payload: Any) -> Any:
        calls.append(payload)
        return payload

    assert sweep()["rearmed"] == 1
    drain(host, clock)

    assert states(pk) == [("settled", "completed")]
    assert calls == [1]
    assert_quiet(host)
