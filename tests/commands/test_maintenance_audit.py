from __future__ import annotations

import json
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django_q.models import Schedule

from durable_agent import lanes
from durable_agent.maintenance import alarm, gate, run_pass
from durable_agent.maintenance.operators.audit import AuditCounts, audit_all
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


def _fleet(clock: FakeClock) -> None:
    """Three hosts of every kind the audit reports, and healthy and borderline ones."""
    from durable_agent.models import BindingRetry, DueLane, MaintenanceState, PassRecord

    now = clock.now()

    def slot(at: datetime, repeats: int = 1) -> Schedule:
        return Schedule.objects.create(
            func="durable_agent.tasks.fire_alarm", schedule_type="O", next_run=at, repeats=repeats
        )

    def clean(key: str, alarm: Schedule | None = None) -> Host:
        made = Host.objects.create(key=key, alarm=alarm)
        MaintenanceState.objects.create(host=made, dirty=1, processed=1)
        return made

    for n in range(3):

        def host(kind: str, alarm: Schedule | None = None, n: int = n) -> Host:
            return clean(f"{kind}-{n}", alarm)

        dirty = host("disarmed")
        MaintenanceState.objects.filter(host=dirty).update(dirty=2)
        late = host("late", slot(now + timedelta(hours=1)))
        DueLane.objects.create(host=late, lane="outbox", due_at=now + timedelta(seconds=n))
        leased = host("leased", slot(now + timedelta(seconds=20)))  # a live lease: not late
        MaintenanceState.objects.filter(host=leased).update(
            dirty=2, pass_lease_owner="w", pass_lease_expires_at=now + timedelta(seconds=30)
        )
        host("overdue", slot(now - timedelta(hours=1)))
        host("cancelled", slot(now - timedelta(hours=1), repeats=0))  # disarmed, nothing owed
        parked = host("parked")
        for lane in range(n + 1):
            DueLane.objects.create(host=parked, lane=f"l{lane}", state="parked", stalls=8)
        ticket = host("ticket")
        MutationTicket.objects.create(
            host=ticket, created_at=now - timedelta(hours=2), expires_at=now - timedelta(hours=1)
        )
        stale = host("stale-lease")
        MaintenanceState.objects.filter(host=stale).update(
            pass_lease_owner="gone", pass_lease_expires_at=now - timedelta(minutes=1)
        )
        waiting = host("binding")
        BindingRetry.objects.create(
            host=waiting, thread="t", submission="s", reported_at=now, registry_key="old"
        )
        for kind, phases in (
            ("failing", ["failed"] * 4),
            ("recovered", ["failed"] * 4 + ["caught-up"]),
            ("failed-then-stale", ["failed"] * 4 + ["stale"]),  # latest not busy: not failed
            ("failed-then-busy", ["failed"] * 4 + ["busy"]),
        ):
            made = host(kind)
            for i, phase in enumerate(phases):
                PassRecord.objects.create(
                    host=made,
                    started_at=now - timedelta(minutes=10 - i),
                    phase=phase,
                    error=f"boom {kind} {i}" if phase == "failed" else "",
                )
        host("healthy", slot(now + timedelta(seconds=1)))
    Host.objects.create(key="stateless")  # no state row, no slot


@pytest.mark.parametrize("listed", [1, 2, 50])
def test_audit__listed_reads_the_same_lists_cut_and_their_full_counts(
    clock: FakeClock, listed: int
) -> None:
    _fleet(clock)
    full = audit_all(registry_key="new")

    cut = audit_all(registry_key="new", listed=listed)

    assert cut.counts == full.counts
    # disarmed, late, binding; failing, failed-then-busy; 1 + 2 + 3 parked lanes
    assert full.counts == AuditCounts(
        violating=9, failing=6, overdue=3, parked_hosts=3, parked_lanes=6, stale_leases=3
    )
    assert cut.violating == full.violating[:listed]
    assert cut.failing == full.failing[:listed]
    assert cut.overdue == full.overdue[:listed]
    assert cut.parked == dict(list(full.parked.items())[:listed])
    assert cut.stale_leases == full.stale_leases[:listed]
    assert (cut.hosts, cut.expired_tickets, cut.attention) == (
        full.hosts,
        full.expired_tickets,
        full.attention,
    )
    assert (cut.ok, cut.degraded) == (full.ok, full.degraded)
