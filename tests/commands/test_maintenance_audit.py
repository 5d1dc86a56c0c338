from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django_q.models import Schedule

from durable_agent import lanes
from durable_agent.maintenance import alarm, gate, run_pass
from durable_agent.maintenance.operators.audit import audit_all
from durable_agent.models import AlarmAudit, Host, MutationTicket
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db


def audit(*args: str) -> tuple[str, int]:
    out = StringIO()
    try:
        call_command("maintenance_audit", *args, stdout=out)
    except CommandError as exc:
        return out.getvalue(), exc.returncode
    return out.getvalue(), 0


def test_audit__clean_hosts_pass(clock: FakeClock, runtime: ScriptedRuntime) -> None:
    host = Host.objects.create(key="clean")
    runtime.submit(host, "t1")
    out, code = audit()
    assert code == 0  # dirty but armed
    run_pass(host)
    out, code = audit("--json")
    assert code == 0
    assert json.loads(out)["ok"] is True


def test_audit__finds_a_planted_violation_and_repair_fixes_it(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host = Host.objects.create(key="planted")
    runtime.submit(host, "t1")
    Schedule.objects.update(repeats=0)  # cancelled behind the app's back
    out, code = audit()
    assert code == 1
    assert "VIOLATION planted: owed work without an armed alarm" in out
    with pytest.raises(CommandError, match=r"^Of 1 host, 1 violates the alarm invariant$"):
        call_command("maintenance_audit", stdout=StringIO())
    out, code = audit("--repair", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["ok"] is False
    assert data["ok_after_repair"] is True
    assert data["repaired"][0]["host"] == "planted"
    assert alarm.scheduled(host) == clock.now() + timedelta(milliseconds=50)
    assert AlarmAudit.objects.filter(host=host, actor="maintenance_audit").count() == 1
    assert audit()[1] == 0


def test_audit__a_slot_later_than_due_work_is_a_violation(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host = Host.objects.create(key="late")
    lanes.register("outbox", lambda ctx: None)
    caught_up(host)
    gate.schedule(host, "outbox", clock.now() + timedelta(seconds=10))
    Schedule.objects.update(next_run=clock.now() + timedelta(hours=1))
    (violating,) = audit_all().violating
    assert "later than the work due" in violating.violations[0]


def test_audit__reports_overdue_parked_tickets_and_leases(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host = Host.objects.create(key="messy")
    runtime.submit(host, "t1")
    MutationTicket.objects.create(
        host=host,
        created_at=clock.now() - timedelta(hours=2),
        expires_at=clock.now() - timedelta(hours=1),
    )
    from durable_agent.models import DueLane, MaintenanceState

    DueLane.objects.create(
        host=host, lane="stuck", state="parked", stalls=8, due_at=clock.now() + timedelta(hours=1)
    )
    MaintenanceState.objects.filter(host=host).update(
        pass_lease_owner="gone", pass_lease_expires_at=clock.now() - timedelta(minutes=5)
    )
    clock.advance(minutes=5)
    summary = audit_all()
    assert summary.overdue == ("messy",)
    assert summary.parked == {"messy": ("stuck",)}
    assert summary.expired_tickets == 1
    assert summary.stale_leases == ("messy",)
    out, _ = audit()
    assert "overdue messy" in out
    assert "parked messy: stuck" in out


def test_deploy_check__reports_a_violation(clock: FakeClock, runtime: ScriptedRuntime) -> None:
    from durable_agent.checks import check_alarm_invariant

    host = Host.objects.create(key="deploy")
    runtime.submit(host, "t1")
    assert check_alarm_invariant(databases=["default"]) == []
    assert check_alarm_invariant() == []  # without --database it does not touch the database
    Schedule.objects.update(repeats=0)
    (error,) = check_alarm_invariant(databases=["default"])
    assert error.id == "durable_agent.E010"
    assert "deploy" in error.msg
