"""The alarm slot: at / earlier / cancel, rollback, rearm and its audit."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import IntegrityError, transaction
from django_q.models import Schedule

from durable_agent.errors import AlarmError, HostNotFound, InvalidDeadline, RearmRefused
from durable_agent.maintenance import alarm, run_alarm_transaction
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.models import AlarmAudit, DueLane, Host, MaintenanceState
from durable_agent.testing import FakeClock
from tests.factories import HostFactory
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db
S = timedelta(seconds=1)


def set_slot(host: Host, op: str, when: datetime | None = None) -> None:
    def fn(tx):
        checkpoint = tx.checkpoint
        getattr(checkpoint, op)(*(() if when is None else (when,)))

    run_alarm_transaction(host, f"test {op}", fn)


def test_at__creates_one_armed_once_schedule(host: Host, clock: FakeClock) -> None:
    t = clock.now() + 10 * S
    set_slot(host, "at", t)
    host.refresh_from_db()
    schedule = host.alarm
    assert schedule is not None
    assert (schedule.schedule_type, schedule.repeats, schedule.next_run) == (Schedule.ONCE, 1, t)
    assert schedule.func == "durable_agent.tasks.fire_alarm"
    assert schedule.args == repr(host.pk)
    assert schedule.intended_date_kwarg == "deadline"
    assert alarm.scheduled(host) == t


def test_at__replaces_even_with_a_later_time(host: Host, clock: FakeClock) -> None:
    set_slot(host, "at", clock.now() + 10 * S)
    set_slot(host, "at", clock.now() + 60 * S)
    assert alarm.scheduled(host) == clock.now() + 60 * S
    assert Schedule.objects.count() == 1


def test_earlier__keeps_the_earlier_time(host: Host, clock: FakeClock) -> None:
    set_slot(host, "at", clock.now() + 10 * S)
    set_slot(host, "earlier", clock.now() + 20 * S)
    assert alarm.scheduled(host) == clock.now() + 10 * S
    set_slot(host, "earlier", clock.now() + 5 * S)
    assert alarm.scheduled(host) == clock.now() + 5 * S


def test_earlier__arms_a_disarmed_slot(host: Host, clock: FakeClock) -> None:
    set_slot(host, "earlier", clock.now() + 7 * S)
    assert alarm.scheduled(host) == clock.now() + 7 * S


def test_cancel__disarms_and_keeps_the_row_for_reuse(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    set_slot(host, "at", clock.now() + 10 * S)
    first = Host.objects.get(pk=host.pk).alarm_id
    set_slot(host, "cancel")
    assert alarm.scheduled(host) is None
    assert Schedule.objects.get(pk=first).repeats == 0
    set_slot(host, "earlier", clock.now() + 3 * S)
    assert Host.objects.get(pk=host.pk).alarm_id == first
    assert Schedule.objects.count() == 1
    assert alarm.scheduled(host) == clock.now() + 3 * S


def test_cancel__on_a_host_without_a_slot_creates_nothing(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    set_slot(host, "cancel")
    assert Schedule.objects.count() == 0


def test_cancel__a_dirty_host_stays_armed(host: Host, clock: FakeClock) -> None:
    # A fresh host owes one pass (dirty=1, processed=0): nothing may leave it disarmed.
    set_slot(host, "cancel")
    assert alarm.scheduled(host) == clock.now() + timedelta(milliseconds=50)


def test_keep_armed__a_read_only_first_use_arms_the_slot(host: Host, clock: FakeClock) -> None:
    from durable_agent.maintenance import gate

    assert gate.snapshot(host, lambda active: active) == 0
    assert alarm.scheduled(host) == clock.now() + timedelta(milliseconds=50)


def test_keep_armed__a_future_lane_keeps_the_slot(host: Host, clock: FakeClock) -> None:
    caught_up(host)

    def fn(tx):
        queue, checkpoint = tx.queue, tx.checkpoint
        queue.dirty("outbox", clock.now() + 30 * S)
        checkpoint.cancel()

    run_alarm_transaction(host, "t", fn)
    assert alarm.scheduled(host) == clock.now() + 30 * S


def test_checkpoint__last_call_wins(host: Host, clock: FakeClock) -> None:
    def fn(tx):
        checkpoint = tx.checkpoint
        checkpoint.at(clock.now() + 1 * S)
        checkpoint.cancel()
        checkpoint.at(clock.now() + 9 * S)

    run_alarm_transaction(host, "test", fn)
    assert alarm.scheduled(host) == clock.now() + 9 * S


def test_checkpoint__a_slot_deleted_behind_our_back_is_recreated(
    host: Host, clock: FakeClock
) -> None:
    set_slot(host, "at", clock.now() + 10 * S)
    Schedule.objects.all().delete()  # host.alarm becomes NULL
    set_slot(host, "earlier", clock.now() + 20 * S)
    assert alarm.scheduled(host) == clock.now() + 20 * S


def test_slot__two_hosts_cannot_share_one_schedule(host: Host, clock: FakeClock) -> None:
    set_slot(host, "at", clock.now() + 10 * S)
    other = HostFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Host.objects.filter(pk=other.pk).update(alarm_id=Host.objects.get(pk=host.pk).alarm_id)


def test_run_alarm_transaction__facts_lanes_and_alarm_roll_back_together(
    host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    set_slot(host, "at", clock.now() + 30 * S)
    before = MaintenanceState.objects.get(host=host)
    lanes_before = list(DueLane.objects.filter(host=host).values_list("lane", "revision", "due_at"))

    def fn(tx):
        state, queue, checkpoint = tx.state, tx.queue, tx.checkpoint
        state.dirty += 5
        queue.dirty("outbox", clock.now() + S)
        queue.dirty(NATIVE, clock.now(), progress=True)
        checkpoint.at(clock.now() + S)
        AlarmAudit.objects.create(host=host, actor="fact", generation=1, at=clock.now())
        raise RuntimeError("boom")

    with pytest.raises(AlarmError) as info:
        run_alarm_transaction(host, "test rollback", fn)
    assert info.value.operation == "test rollback"
    assert str(info.value) == "test rollback: boom"
    after = MaintenanceState.objects.get(host=host)
    assert (after.dirty, after.processed) == (before.dirty, before.processed)
    assert list(DueLane.objects.filter(host=host).values_list("lane", "revision", "due_at")) == (
        lanes_before
    )
    assert AlarmAudit.objects.count() == 0
    assert alarm.scheduled(host) == clock.now() + 30 * S


def test_run_alarm_transaction__negative_generation_is_refused(
    host: Host, clock: FakeClock
) -> None:
    set_slot(host, "at", clock.now() + 30 * S)

    def fn(tx):
        state, checkpoint = tx.state, tx.checkpoint
        state.processed = -1
        checkpoint.cancel()

    with pytest.raises(AlarmError, match="must not be negative"):
        run_alarm_transaction(host, "test negative", fn)
    state = MaintenanceState.objects.get(host=host)
    assert state.processed == 0
    assert alarm.scheduled(host) == clock.now() + 30 * S


def test_run_alarm_transaction__unknown_host_writes_nothing(db: None) -> None:
    for ref in ("no-such-host", 987654, Host(key="unsaved")):
        with pytest.raises(HostNotFound):
            run_alarm_transaction(ref, "test", lambda tx: tx.checkpoint.at(tx.state.updated_at))
    assert MaintenanceState.objects.count() == 0
    assert Schedule.objects.count() == 0


def test_run_alarm_transaction__creates_state_and_native_lane_on_first_use(
    host: Host, clock: FakeClock
) -> None:
    run_alarm_transaction(host, "test", lambda tx: None)
    state = MaintenanceState.objects.get(host=host)
    assert (state.dirty, state.processed) == (1, 0)
    native = DueLane.objects.get(host=host, lane=NATIVE)
    assert native.revision == 0
    assert native.state == "pending"


def test_scheduled__unknown_host(db: None) -> None:
    with pytest.raises(HostNotFound):
        alarm.scheduled("nobody")


# -- rearm ---------------------------------------------------------------------------------


def test_rearm__recomputes_from_the_lanes_and_audits(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    run_alarm_transaction(host, "t", lambda tx: tx.queue.dirty("outbox", clock.now() + 10 * S))
    set_slot(host, "at", clock.now() + 3600 * S)  # wrong: later than the due lane

    new = alarm.rearm(host, actor="ops", reason="slot drifted")

    assert new == clock.now() + 10 * S
    assert alarm.scheduled(host) == new
    audit = AlarmAudit.objects.get()
    assert (audit.actor, audit.action, audit.reason) == ("ops", "rearm", "slot drifted")
    assert audit.old_deadline == clock.now() + 3600 * S
    assert audit.new_deadline == new
    assert audit.generation == MaintenanceState.objects.get(host=host).dirty
    assert audit.at == clock.now()


def test_rearm__a_dirty_host_gets_the_minimum_delay(host: Host, clock: FakeClock) -> None:
    # A fresh host: dirty=1 > processed=0, native lane due at the epoch.
    assert alarm.rearm(host) == clock.now() + timedelta(milliseconds=50)
    assert AlarmAudit.objects.get().actor == "system"


def test_rearm__honours_a_matching_durable_backoff(host: Host, clock: FakeClock) -> None:
    def fn(tx):
        state, queue = tx.state, tx.queue
        state.retry_generation = state.dirty
        state.retry_not_before = clock.now() + 4 * S
        state.retry_native_only = True
        state.retry_stalls = 2
        queue.checkpoint_native(None)

    run_alarm_transaction(host, "t", fn)
    assert alarm.rearm(host) == clock.now() + 4 * S


def test_rearm__nothing_due_disarms(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    set_slot(host, "at", clock.now() + 10 * S)
    assert alarm.rearm(host, reason="clean") is None
    assert alarm.scheduled(host) is None
    assert AlarmAudit.objects.get().new_deadline is None


def test_rearm__explicit_time_at_or_before_the_computed_one(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    run_alarm_transaction(host, "t", lambda tx: tx.queue.dirty("outbox", clock.now() + 10 * S))
    at = clock.now() + 2 * S
    assert alarm.rearm(host, at=at, actor="ops", reason="sooner") == at
    assert alarm.scheduled(host) == at
    assert AlarmAudit.objects.get().detail["requested"] == at.isoformat()


def test_rearm__explicit_time_into_a_disarmed_host(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    at = clock.now() + 60 * S
    assert alarm.rearm(host, at=at, reason="probe") == at
    assert alarm.scheduled(host) == at
    assert AlarmAudit.objects.count() == 1


def test_rearm__refuses_to_postpone_due_work(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    run_alarm_transaction(host, "t", lambda tx: tx.queue.dirty("outbox", clock.now() + 10 * S))
    set_slot(host, "at", clock.now() + 10 * S)
    with pytest.raises(RearmRefused, match="would postpone work due at"):
        alarm.rearm(host, at=clock.now() + 20 * S, reason="later")
    assert alarm.scheduled(host) == clock.now() + 10 * S
    assert AlarmAudit.objects.count() == 0


def test_rearm__bad_input_writes_nothing(host: Host, clock: FakeClock) -> None:
    with pytest.raises(InvalidDeadline):
        alarm.rearm(host, at=datetime(2030, 1, 1), reason="naive")
    with pytest.raises(InvalidDeadline):
        alarm.rearm(host, at=float("inf"), reason="not a datetime")  # type: ignore[arg-type]
    with pytest.raises(HostNotFound):
        alarm.rearm("nobody", reason="x")
    assert AlarmAudit.objects.count() == 0
    assert Schedule.objects.count() == 0
