"""Lane phases: a phase is a row of one table, and no pass skips a due lane of any phase
(Note [Lane phases] in ``durable_agent/maintenance/passes/lane_registry.py``)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from durable_agent import conf, lanes
from durable_agent.errors import LaneNotRegistered
from durable_agent.maintenance import alarm, gate, lane_registry, run_pass
from durable_agent.maintenance.passes.lane_registry import LaneSpec
from durable_agent.models import DueLane, Host
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db


def test_phase__a_new_phase_is_a_row_of_the_table_and_its_due_lane_runs(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new phase whose waves run after the native step, as the after-native ones do.
    monkeypatch.setitem(lane_registry.PHASES, "late", lane_registry.AFTER_NATIVE)
    ran: list[datetime] = []

    def late(ctx: object) -> None:
        ran.append(clock.now())

    lanes.register("late", late, phase="late")  # type: ignore[arg-type]
    caught_up(host)
    gate.schedule(host, "late", clock.now())
    report = run_pass(host)
    assert ran == [clock.now()]
    assert report.alarm == "cleared"
    assert DueLane.objects.get(host=host, lane="late").state == "idle"
    assert alarm.scheduled(host) is None


def test_phase__a_due_lane_of_a_phase_no_step_runs_fails_the_pass_and_backs_off(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    # A caught-up pass must not skip the lane and re-arm its slot at the minimum delay forever.
    ran: list[datetime] = []

    def odd(ctx: object) -> None:
        ran.append(clock.now())

    lanes.register("odd", odd)
    spec = lane_registry.handler("odd")
    assert spec is not None
    lane_registry._host_lanes["odd"] = LaneSpec("odd", odd, "unknown-phase")  # type: ignore[arg-type]
    caught_up(host)
    gate.schedule(host, "odd", clock.now())
    with pytest.raises(LaneNotRegistered, match="No step of the pass runs phase 'unknown-phase'"):
        run_pass(host)
    assert ran == []
    row = DueLane.objects.get(host=host, lane="odd")
    assert row.stalls == 1
    assert row.due_at is not None
    assert row.due_at > clock.now() + conf.minimum_alarm_delay()
    slot = alarm.scheduled(host)
    assert slot is not None
    assert slot > clock.now() + conf.minimum_alarm_delay() - timedelta(milliseconds=1)
