"""Retention: the sweep prunes old rows in bounded batches (docs/operations.md#retention)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django_q.models import OrmQ, Task

from durable_agent.maintenance import retention, selectors
from durable_agent.models import (
    AlarmAudit,
    Host,
    MaintenanceState,
    MutationTicket,
    PassPhase,
    PassRecord,
    RecoveryEvent,
)
from durable_agent.tasks import sweep
from durable_agent.testing import FakeClock
from tests.factories import (
    AlarmAuditFactory,
    HostFactory,
    MaintenanceStateFactory,
    MutationTicketFactory,
    PassRecordFactory,
    RecoveryEventFactory,
)

pytestmark = pytest.mark.django_db
DAY = timedelta(days=1)
MINUTE_MS = 60_000
FAILED, CAUGHT_UP, ACTIONABLE = PassPhase.FAILED, PassPhase.CAUGHT_UP, PassPhase.ACTIONABLE
SHORT = {
    "RETENTION_PASS_RECORDS_MS": MINUTE_MS,
    "RETENTION_AUDIT_MS": MINUTE_MS,
    "RETENTION_RECOVERY_EVENTS_MS": MINUTE_MS,
    "RETENTION_TASKS_MS": MINUTE_MS,
}


def _task(name: str, *, stopped_at: object, func: str = "durable_agent.tasks.fire_alarm") -> Task:
    return Task.objects.create(
        id=name,
        name=name,
        func=func,
        started=stopped_at,
        stopped=stopped_at,
        success=True,
    )


def test_pass_records__old_ones_a_later_success_follows_go(clock: FakeClock) -> None:
    busy, streak, idle = HostFactory(), HostFactory(), HostFactory()
    now = clock.now()

    def record(host: Host, days: int, phase: str) -> PassRecord:
        return PassRecordFactory(host=host, started_at=now - days * DAY, phase=phase)

    gone = [
        record(busy, 33, FAILED),
        record(busy, 32, CAUGHT_UP),
        record(busy, 31, FAILED),
        record(idle, 400, CAUGHT_UP),
    ]
    young = record(busy, 29, ACTIONABLE)  # young: kept whatever follows
    # No success after them: the last success and the failure streak after it stay.
    kept = [record(streak, 50, CAUGHT_UP), record(streak, 40, FAILED), record(streak, 35, FAILED)]
    last = record(idle, 300, CAUGHT_UP)  # an idle host's last pass stays
    streaks = Host.objects.annotate(n=selectors.failure_streak()).order_by("pk")
    before = list(streaks.values_list("n", flat=True))
    assert sweep()["pruned_pass_records"] == len(gone)
    left = set(PassRecord.objects.values_list("pk", flat=True))
    assert left == {young.pk, last.pk, *(r.pk for r in kept)}
    assert list(streaks.values_list("n", flat=True)) == before == [0, 2, 0]


def test_audits__older_than_the_retention_go(clock: FakeClock) -> None:
    now = clock.now()
    old = AlarmAuditFactory(at=now - 366 * DAY)
    young = AlarmAuditFactory(at=now - 364 * DAY)
    assert sweep()["pruned_audits"] == 1
    assert list(AlarmAudit.objects.values_list("pk", flat=True)) == [young.pk]
    assert not AlarmAudit.objects.filter(pk=old.pk).exists()


def test_recovery_events__only_delivered_and_acknowledged_ones_go(clock: FakeClock) -> None:
    now = clock.now()
    state = MaintenanceStateFactory(recovery_event_sequence=4, recovery_event_acknowledged=2)
    host = state.host
    delivered_old = RecoveryEventFactory(host=host, sequence=1, delivered_at=now - 31 * DAY)
    delivered_young = RecoveryEventFactory(host=host, sequence=2, delivered_at=now - 29 * DAY)
    # Not acknowledged: a delivery stamp without the state's acknowledgement never counts.
    stamped = RecoveryEventFactory(host=host, sequence=3, delivered_at=now - 40 * DAY)
    undelivered = RecoveryEventFactory(host=host, sequence=4, occurred_at=now - 400 * DAY)
    assert sweep()["pruned_recovery_events"] == 1
    left = set(RecoveryEvent.objects.values_list("pk", flat=True))
    assert left == {delivered_young.pk, stamped.pk, undelivered.pk}
    assert delivered_old.pk not in left
    assert MaintenanceState.objects.get(pk=host.pk).recovery_event_acknowledged == 2


def test_mutation_tickets__live_and_recently_expired_ones_stay(clock: FakeClock) -> None:
    now = clock.now()
    long_expired = MutationTicketFactory(
        created_at=now - timedelta(hours=3), expires_at=now - timedelta(minutes=61)
    )
    recent = MutationTicketFactory(
        created_at=now - timedelta(hours=1), expires_at=now - timedelta(minutes=59)
    )
    live = MutationTicketFactory(created_at=now, expires_at=now + timedelta(minutes=1))
    assert sweep()["expired_tickets"] == 1
    left = set(MutationTicket.objects.values_list("pk", flat=True))
    assert left == {recent.pk, live.pk}
    assert long_expired.pk not in left


def test_tasks__old_alarm_task_results_go_other_functions_and_the_queue_stay(
    clock: FakeClock,
) -> None:
    now = clock.now()
    _task("old", stopped_at=now - 8 * DAY)
    _task("young", stopped_at=now - 6 * DAY)
    _task("theirs", stopped_at=now - 80 * DAY, func="myapp.tasks.report")
    OrmQ.objects.create(key="durable_agent", payload="x", lock=now - 80 * DAY)
    assert sweep()["pruned_tasks"] == 1
    assert set(Task.objects.values_list("id", flat=True)) == {"young", "theirs"}
    assert OrmQ.objects.count() == 1


def test_batches__one_sweep_deletes_at_most_one_batch_per_table(clock: FakeClock) -> None:
    now = clock.now()
    host = HostFactory()
    MaintenanceStateFactory(host=host, recovery_event_sequence=7, recovery_event_acknowledged=7)
    for i in range(7):
        at = now - 2 * DAY + i * timedelta(seconds=1)
        PassRecordFactory(host=host, started_at=at)
        AlarmAuditFactory(host=host, at=at)
        RecoveryEventFactory(host=host, sequence=i + 1, delivered_at=at)
        MutationTicketFactory(host=host, created_at=at - DAY, expires_at=at)
        _task(f"task-{i}", stopped_at=at)
    PassRecordFactory(host=host, started_at=now)  # a later success; it stays
    with override_settings(DURABLE_AGENT={**SHORT, "RETENTION_BATCH_SIZE": 3}):
        first = sweep()
        assert {k: v for k, v in first.items() if k != "rearmed"} == {
            "pruned_pass_records": 3,
            "pruned_audits": 3,
            "pruned_recovery_events": 3,
            "expired_tickets": 3,
            "pruned_tasks": 3,
            "pruned_submissions": 0,
        }
        assert PassRecord.objects.count() == 5
        second, third = sweep(), sweep()
    assert second["pruned_audits"] == 3
    assert third["pruned_audits"] == 1
    assert (PassRecord.objects.count(), AlarmAudit.objects.count()) == (1, 0)
    assert (RecoveryEvent.objects.count(), MutationTicket.objects.count()) == (0, 0)
    assert Task.objects.count() == 0


def test_batches__the_oldest_rows_go_first(clock: FakeClock) -> None:
    now = clock.now()
    ages = [5, 9, 3, 7]
    audits = {age: AlarmAuditFactory(at=now - age * DAY) for age in ages}
    with override_settings(DURABLE_AGENT={**SHORT, "RETENTION_BATCH_SIZE": 2}):
        assert retention.prune()["pruned_audits"] == 2
    left = set(AlarmAudit.objects.values_list("pk", flat=True))
    assert left == {audits[5].pk, audits[3].pk}


def test_none_disables_each_retention(clock: FakeClock) -> None:
    now = clock.now()
    host = HostFactory()
    MaintenanceStateFactory(host=host, recovery_event_sequence=1, recovery_event_acknowledged=1)
    PassRecordFactory(host=host, started_at=now - 400 * DAY)
    PassRecordFactory(host=host, started_at=now - 300 * DAY)
    AlarmAuditFactory(host=host, at=now - 4000 * DAY)
    RecoveryEventFactory(host=host, sequence=1, delivered_at=now - 400 * DAY)
    _task("ancient", stopped_at=now - 400 * DAY)
    off = {
        "RETENTION_PASS_RECORDS_MS": None,
        "RETENTION_AUDIT_MS": None,
        "RETENTION_RECOVERY_EVENTS_MS": None,
        "RETENTION_TASKS_MS": None,
    }
    with override_settings(DURABLE_AGENT=off):
        result = sweep()
    assert not any(v for k, v in result.items() if k != "rearmed")
    assert (PassRecord.objects.count(), AlarmAudit.objects.count()) == (2, 1)
    assert (RecoveryEvent.objects.count(), Task.objects.count()) == (1, 1)


def test_ages_follow_the_injected_clock(clock: FakeClock) -> None:
    record_host = HostFactory()
    PassRecordFactory(host=record_host, started_at=clock.now())
    audit = AlarmAuditFactory(at=clock.now())
    with override_settings(DURABLE_AGENT=SHORT):
        clock.advance(seconds=59)
        assert sweep()["pruned_audits"] == 0
        clock.advance(seconds=1)
        assert sweep()["pruned_audits"] == 1
    assert not AlarmAudit.objects.filter(pk=audit.pk).exists()


def test_a_failing_table_is_logged_and_the_others_are_still_pruned(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django.db import DatabaseError

    now = clock.now()
    AlarmAuditFactory(at=now - 400 * DAY)
    _task("old", stopped_at=now - 8 * DAY)
    real = retention._delete_batch

    def failing(queryset: Any, **kwargs: Any) -> int:
        if queryset.model is AlarmAudit:
            raise DatabaseError("canceling statement due to lock timeout")
        return real(queryset, **kwargs)

    monkeypatch.setattr(retention, "_delete_batch", failing)
    result = sweep()
    assert (result["pruned_audits"], result["pruned_tasks"]) == (0, 1)
    assert "Retention could not prune AlarmAudit" in caplog.text
