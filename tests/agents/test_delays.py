"""Delayed work: ``submit(..., not_before=...)`` starts its agent at its time, never sooner."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

import durable_agent
from durable_agent.agents import attempts, delays
from durable_agent.errors import InvalidDeadline, InvalidInput
from durable_agent.maintenance import alarm, run_pass
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.models import DueLane, Host, Submission
from durable_agent.runtime.protocol import START_LEAD
from durable_agent.testing import FakeClock
from tests.agents.conftest import drain, generation

pytestmark = pytest.mark.django_db


def outcome(pk: int) -> tuple[str, str | None]:
    row = Submission.objects.get(pk=pk)
    return row.state, row.outcome


def test_delays__a_timedelta_starts_the_agent_at_its_time_never_sooner(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    start = clock.now()
    receipt = durable_agent.submit(
        host=host, thread="t", agent="echo", payload=1, not_before=timedelta(minutes=5)
    )

    assert receipt.created
    assert receipt.state == "ready"
    row = Submission.objects.get(pk=receipt.submission_id)
    assert row.not_before == start + timedelta(minutes=5)
    run_pass(host)  # the pass that classifies the new work
    assert calls == []
    assert alarm.scheduled(host) == start + timedelta(minutes=5) - START_LEAD
    dirty, processed = generation(host) or (0, 0)
    assert dirty > processed  # the work is owed, only later

    clock.set(start + timedelta(minutes=5) - START_LEAD - timedelta(milliseconds=1))
    run_pass(host)  # an early pass (a stray delivery) does not start it
    assert calls == []
    slot = alarm.scheduled(host)
    assert slot is not None
    assert slot >= start + timedelta(minutes=5) - START_LEAD

    drain(host, clock)

    assert calls == [("echo", 1)]
    assert outcome(receipt.submission_id) == ("settled", "completed")
    assert alarm.scheduled(host) is None


def test_delays__an_aware_datetime_and_the_followers_on_its_thread_wait(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    at = clock.now() + timedelta(hours=2)
    first = durable_agent.submit(host=host, thread="t", agent="echo", payload="late", not_before=at)
    behind = durable_agent.submit(host=host, thread="t", agent="echo", payload="behind")
    other = durable_agent.submit(host=host, thread="u", agent="echo", payload="other")

    run_pass(host)

    assert calls == [("echo", "other")]  # another thread is not held up
    assert outcome(behind.submission_id) == ("ready", None)
    assert alarm.scheduled(host) == at - START_LEAD

    drain(host, clock)

    assert calls == [("echo", "other"), ("echo", "late"), ("echo", "behind")]
    assert outcome(first.submission_id) == ("settled", "completed")
    assert outcome(other.submission_id) == ("settled", "completed")


def test_delays__a_replayed_key_keeps_the_original_time(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    first = durable_agent.submit(
        host=host,
        thread="t",
        agent="echo",
        payload=1,
        idempotency_key="k",
        not_before=timedelta(minutes=1),
    )
    clock.advance(ms=30_000)
    again = durable_agent.submit(
        host=host,
        thread="t",
        agent="echo",
        payload=1,
        idempotency_key="k",
        not_before=timedelta(minutes=1),
    )

    assert not again.created
    assert again.submission_id == first.submission_id
    row = Submission.objects.get(pk=first.submission_id)
    assert row.not_before == clock.now() - timedelta(seconds=30) + timedelta(minutes=1)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (datetime(2030, 1, 1), InvalidDeadline),  # naive
        (timedelta(seconds=-1), InvalidInput),
        (delays.MAX_DELAY + timedelta(seconds=1), InvalidInput),
        ("tomorrow", InvalidInput),
        (60, InvalidInput),
    ],
)
def test_delays__bad_input_is_refused_and_admits_nothing(
    host: Host, clock: FakeClock, echo: Any, value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        durable_agent.submit(host=host, thread="t", agent="echo", payload=1, not_before=value)

    assert not Submission.objects.exists()
    assert generation(host) is None


def test_delays__a_past_time_runs_at_once(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    durable_agent.submit(
        host=host,
        thread="t",
        agent="echo",
        payload=1,
        not_before=clock.now() - timedelta(days=1),
    )

    run_pass(host)

    assert calls == [("echo", 1)]


@pytest.mark.parametrize("delay_ms", [100, 250, 999])
def test_delays__a_sub_second_delay_is_due_at_its_time_not_at_the_claims_floor(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any], delay_ms: int
) -> None:
    """Waiting for a time is not a stall: the native claim's 1 s floor does not delay it."""
    start = clock.now()
    at = start + timedelta(milliseconds=delay_ms)
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1, not_before=at)

    run_pass(host)  # claims the native lane (its floor: 1 s), finds only a delayed head

    assert calls == []
    assert alarm.scheduled(host) == at - START_LEAD
    clock.set(at - START_LEAD)
    run_pass(host)
    assert calls == [("echo", 1)]


def test_delays__delays_in_turn_never_build_up_a_backoff(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    """Ten delayed heads in turn on one thread: each starts at its own time."""
    start = clock.now()
    times = [start + timedelta(milliseconds=300 * (i + 1)) for i in range(10)]
    for i, at in enumerate(times):
        durable_agent.submit(host=host, thread="t", agent="echo", payload=i, not_before=at)

    run_pass(host)
    for i, at in enumerate(times):
        assert alarm.scheduled(host) == at - START_LEAD
        clock.set(at - START_LEAD)
        run_pass(host)
        assert calls[-1] == ("echo", i)


def test_delays__a_pass_within_the_lead_holds_the_agent_until_its_time(
    host: Host, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Note [Start delayed work at its time]: begun up to the lead early, started on time."""
    seen: list[datetime] = []

    @durable_agent.agent("clock-reader", version="1")
    def clock_reader(ctx: Any, payload: Any) -> None:
        seen.append(clock.now())

    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the hold, on the test's clock
        slept.append(seconds)
        clock.advance(ms=seconds * 1000)

    monkeypatch.setattr(attempts.time, "sleep", sleep)
    at = clock.now() + timedelta(seconds=10)
    durable_agent.submit(host=host, thread="t", agent="clock-reader", payload=1, not_before=at)
    run_pass(host)
    clock.set(at - timedelta(milliseconds=20))

    run_pass(host)

    assert slept == [pytest.approx(0.02)]
    assert seen == [at]


def test_delays__the_submit_arms_the_slot_for_the_start_not_for_now(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    """One pass per delayed submission: its commit arms the slot for when its pass begins."""
    at = clock.now() + timedelta(seconds=30)
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1, not_before=at)

    assert alarm.scheduled(host) == at - START_LEAD
    dirty, processed = generation(host) or (0, 0)
    assert dirty > processed  # owed, and armed for it

    reports = drain(host, clock)

    assert calls == [("echo", 1)]
    assert [r.phase for r in reports] == ["actionable"]


def test_delays__a_delayed_submission_never_delays_work_already_due(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    now = clock.now()
    durable_agent.submit(host=host, thread="a", agent="echo", payload="now")
    durable_agent.submit(
        host=host, thread="b", agent="echo", payload="later", not_before=now + timedelta(hours=1)
    )

    assert DueLane.objects.get(host=host, lane=NATIVE).due_at == now  # not an hour later
    assert alarm.scheduled(host) == now + timedelta(milliseconds=50)  # the minimum delay
    clock.set(now + timedelta(milliseconds=50))
    run_pass(host)
    assert calls == [("echo", "now")]
