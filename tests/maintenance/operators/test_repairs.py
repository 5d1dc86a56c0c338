from __future__ import annotations

from datetime import timedelta

import pytest

from durable_agent import lanes
from durable_agent.maintenance import alarm, gate, repairs, run_pass
from durable_agent.models import AlarmAudit, BindingRetry, DueLane, Host, RecoveryFault
from durable_agent.runtime import Blocked, RecoverySweep
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.maintenance.helpers import caught_up, drain, generations

pytestmark = pytest.mark.django_db


def park(host: Host, clock: FakeClock) -> None:
    lanes.register("outbox", lambda ctx: ctx.now())
    caught_up(host)
    gate.schedule(host, "outbox", clock.now())
    for _ in range(8):
        slot = alarm.scheduled(host)
        clock.set(max(slot, clock.now()))
        run_pass(host, deadline=slot, guard=True)
    assert DueLane.objects.get(host=host, lane="outbox").state == "parked"


def test_unpark__fresh_budget_due_now_and_audited(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    park(host, clock)
    result = repairs.lane_unpark(host=host, lane="outbox", actor="ops", reason="fixed the sink")
    row = DueLane.objects.get(host=host, lane="outbox")
    assert (row.state, row.stalls, row.not_before, row.due_at) == ("pending", 0, None, clock.now())
    assert result.alarm == clock.now() + timedelta(milliseconds=50)
    audit = AlarmAudit.objects.get(pk=result.audit_id)
    assert (audit.action, audit.actor, audit.reason) == ("unpark", "ops", "fixed the sink")
    assert audit.detail["stalls"] == 8


def test_unpark__refuses_a_lane_that_is_not_parked(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    caught_up(host)
    gate.schedule(host, "outbox", clock.now())
    with pytest.raises(repairs.NotRepairable, match="not parked"):
        repairs.lane_unpark(host=host, lane="outbox", reason="x")
    with pytest.raises(repairs.RepairTargetNotFound):
        repairs.lane_unpark(host=host, lane="nope", reason="x")
    assert AlarmAudit.objects.count() == 0


def test_binding_retry_now__one_native_opportunity(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    item = runtime.submit(host, "t1", behaviour="binding")
    run_pass(host)
    assert alarm.scheduled(host) is None
    retry = BindingRetry.objects.get()
    item.behaviour = "settle"
    dirty = generations(host)[0]
    result = repairs.binding_retry_now(host=host, retry_id=retry.pk, actor="ops", reason="hotfix")
    assert generations(host)[0] == dirty + 1
    assert result.alarm is not None
    assert not BindingRetry.objects.exists()
    drain(host, clock)
    assert item.settled
    with pytest.raises(repairs.RepairTargetNotFound):
        repairs.binding_retry_now(host=host, retry_id=retry.pk, reason="again")


def test_fault_retry_now__retries_recovery_immediately(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    item = runtime.submit(host, "t1")
    runtime.script_recovery(host, "t1", RecoverySweep(blocked=(Blocked("t1", {"reason": "x"}),)))
    run_pass(host)
    fault = RecoveryFault.objects.get(host=host)
    assert fault.retry_at == clock.now() + timedelta(seconds=5)
    result = repairs.fault_retry_now(host=host, thread="t1", actor="ops", reason="db back")
    assert RecoveryFault.objects.get(host=host).retry_at == clock.now()
    assert AlarmAudit.objects.get(pk=result.audit_id).action == "retry-fault"
    runtime.calls.clear()
    clock.advance(ms=50)
    run_pass(host)  # recovery is retried at once (not 5 s later), and succeeds
    assert ("run_recovery", "t1", "None") in runtime.calls
    assert not RecoveryFault.objects.filter(host=host).exists()
    drain(host, clock)
    assert item.settled


def test_pass_now__audited_then_run(host: Host, clock: FakeClock, runtime: ScriptedRuntime) -> None:
    item = runtime.submit(host, "t1")
    report = repairs.pass_now(host=host, actor="ops", reason="impatient")
    assert item.settled
    assert report.settled == 1
    assert AlarmAudit.objects.get().action == "pass"


@pytest.mark.parametrize("reason", [None, 5, "x" * 2001])
def test_repairs__bad_reasons_change_nothing(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, reason: object
) -> None:
    with pytest.raises(ValueError, match="reason"):
        repairs.lane_unpark(host=host, lane="outbox", reason=reason)  # type: ignore[arg-type]
    assert AlarmAudit.objects.count() == 0
