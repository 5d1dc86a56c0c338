"""Lifecycle signals: each sent once, after the change it reports has committed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.dispatch import Signal

import durable_agent
from durable_agent import lanes, signals
from durable_agent.maintenance import alarm, gate, repairs, run_pass
from durable_agent.maintenance.operators.repairs import NotRepairable
from durable_agent.maintenance.passes import report_parked
from durable_agent.models import AlarmAudit, DueLane, Host, PassRecord, Submission
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.agents.test_services import make
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db

Capture = Callable[..., Any]


@pytest.fixture
def received() -> Iterator[Callable[[Signal], list[dict[str, Any]]]]:
    """``received(signal)``: connect a recording receiver; the list of its calls' kwargs."""
    connected: list[tuple[Signal, Any]] = []

    def connect(signal: Signal) -> list[dict[str, Any]]:
        calls: list[dict[str, Any]] = []

        def receiver(sender: Any, **kwargs: Any) -> None:
            calls.append({"sender": sender, **kwargs})

        signal.connect(receiver, weak=False)
        connected.append((signal, receiver))
        return calls

    yield connect
    for signal, receiver in connected:
        signal.disconnect(receiver)


def test_pass_finished__after_commit_with_the_report(
    host: Host,
    clock: FakeClock,
    runtime: ScriptedRuntime,
    received: Any,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    calls = received(signals.pass_finished)
    runtime.submit(host, "t1")
    with django_capture_on_commit_callbacks(execute=True):
        report = run_pass(host)
        assert calls == []  # not before the commit
    assert len(calls) == 1
    call = calls[0]
    assert (call["sender"], call["host"], call["report"], call["error"]) == (
        PassRecord,
        host,
        report,
        None,
    )
    assert call["duration_s"] == 0.0  # the fake clock did not move


def test_pass_finished__a_failed_pass_carries_its_error(
    host: Host,
    clock: FakeClock,
    runtime: ScriptedRuntime,
    received: Any,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    calls = received(signals.pass_finished)
    caught_up(host)
    gate.schedule(host, "orphan", clock.now())
    with (
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(durable_agent.errors.LaneNotRegistered),
    ):
        run_pass(host)
    assert [(c["report"].phase, type(c["error"]).__name__) for c in calls] == [
        ("failed", "LaneNotRegistered")
    ]


def test_lane_parked__once_per_parking(
    host: Host, clock: FakeClock, received: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    calls = received(signals.lane_parked)
    DueLane.objects.create(host=host, lane="stuck", state="parked", stalls=8, due_at=clock.now())
    with django_capture_on_commit_callbacks(execute=True):
        report_parked(host.pk)
        report_parked(host.pk)
    assert [(c["sender"], c["host"], c["lane"]) for c in calls] == [(DueLane, host, "stuck")]


def test_lane_unparked_and_repair_performed__after_commit(
    host: Host, clock: FakeClock, received: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    unparked = received(signals.lane_unparked)
    performed = received(signals.repair_performed)
    DueLane.objects.create(host=host, lane="stuck", state="parked", stalls=8, due_at=clock.now())
    with django_capture_on_commit_callbacks(execute=True):
        repairs.lane_unpark(host=host, lane="stuck", actor="eve", reason="fixed the handler")
        assert unparked == performed == []
    audit = AlarmAudit.objects.get(host=host, action="unpark")
    assert [(c["host"], c["lane"], c["audit"]) for c in unparked] == [(host, "stuck", audit)]
    assert [(c["sender"], c["host"], c["audit"]) for c in performed] == [(AlarmAudit, host, audit)]


def test_signals__not_sent_for_a_change_that_rolled_back(
    host: Host, clock: FakeClock, received: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    unparked = received(signals.lane_unparked)
    performed = received(signals.repair_performed)
    DueLane.objects.create(host=host, lane="idle", state="idle", due_at=None)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(NotRepairable):
        repairs.lane_unpark(host=host, lane="idle", actor="eve")
    assert unparked == performed == []


def test_alarm_rearmed__with_the_old_and_new_deadline(
    host: Host, clock: FakeClock, received: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    rearmed = received(signals.alarm_rearmed)
    performed = received(signals.repair_performed)
    at = clock.now()
    with django_capture_on_commit_callbacks(execute=True):
        alarm.rearm(host, at=at, actor="eve", reason="test")
    audit = AlarmAudit.objects.get(host=host, action="rearm")
    assert [(c["sender"], c["host"], c["new_deadline"], c["audit"]) for c in rearmed] == [
        (Host, host, at, audit)
    ]
    assert [c["audit"] for c in performed] == [audit]


def test_submission_settled__from_an_operator_action(
    host: Host, clock: FakeClock, received: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    settled = received(signals.submission_settled)
    performed = received(signals.repair_performed)
    row = make(host)
    with django_capture_on_commit_callbacks(execute=True):
        durable_agent.abort(row, actor="eve", reason="dup")
        assert settled == []
    assert [(c["sender"], c["submission_id"], c["host_id"], c["outcome"]) for c in settled] == [
        (Submission, row.pk, host.pk, "aborted")
    ]
    assert [(c["host"], c["audit"].action) for c in performed] == [(host, "abort")]


def test_signals__a_raising_receiver_is_logged_and_the_change_stands(
    host: Host,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    signals.submission_settled.connect(broken, weak=False)
    try:
        row = make(host)
        with caplog.at_level(logging.ERROR, "durable_agent.signals"):
            with django_capture_on_commit_callbacks(execute=True):
                durable_agent.abort(row)
    finally:
        signals.submission_settled.disconnect(broken)
    assert Submission.objects.get(pk=row.pk).outcome == "aborted"
    [record] = [r for r in caplog.records if r.name == "durable_agent.signals"]
    assert "submission_settled" in record.getMessage()
    assert record.action == "submission_settled"  # type: ignore[attr-defined]


def test_pass_finished__a_lane_wave_pass_with_no_receiver_sends_nothing(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    lanes.register("outbox", lambda ctx: None)
    caught_up(host)
    gate.schedule(host, "outbox", clock.now())
    # The Prometheus pass metrics (installed here) listen; a deployment without them does not.
    monkeypatch.setattr(signals.pass_finished, "receivers", [])
    signals.pass_finished.sender_receivers_cache.clear()
    assert not signals.pass_finished.has_listeners(PassRecord)
    assert run_pass(host).phase in ("caught-up", "actionable")
