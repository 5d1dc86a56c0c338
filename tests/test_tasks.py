"""fire_alarm through django-q's stock scheduler: the guard, the record, the lateness."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from django_q.models import Schedule

from durable_agent import conf
from durable_agent.maintenance import alarm, gate
from durable_agent.maintenance.lane_ids import LIFECYCLE
from durable_agent.maintenance.store import rows
from durable_agent.models import Host, MaintenanceState, PassRecord
from durable_agent.tasks import fire_alarm
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.maintenance.helpers import caught_up
from tests.qdrive import drain_alarms, fire_due

pytestmark = pytest.mark.django_db(transaction=True)
MS = timedelta(milliseconds=1)
NOTHING_PRUNED = {
    "pruned_pass_records": 0,
    "pruned_audits": 0,
    "pruned_recovery_events": 0,
    "expired_tickets": 0,
    "pruned_tasks": 0,
    "pruned_submissions": 0,
}


def test_fire_alarm__the_scheduler_fires_the_slot_and_the_pass_runs(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host = Host.objects.create(key="fired")
    items = [runtime.submit(host, "t1") for _ in range(3)] + [runtime.submit(host, "t2")]
    slot = alarm.scheduled(host)
    assert fire_due(clock) == []  # not due yet: django-q leaves it alone
    clock.set(slot + 5 * MS)
    (result,) = fire_due(clock)
    assert result["phase"] == "actionable"
    assert result["lateness_ms"] == 5
    drain_alarms(clock)
    assert all(item.settled for item in items)
    state = MaintenanceState.objects.get(host=host)
    assert state.dirty == state.processed
    assert alarm.scheduled(host) is None
    assert Schedule.objects.count() == 1  # one reusable slot row
    record = PassRecord.objects.filter(host=host).order_by("started_at", "id").first()
    assert (record.deadline, record.lateness_ms) == (slot, 5)


def _settled_by_its_alarm(
    key: str, clock: FakeClock, runtime: ScriptedRuntime
) -> tuple[Host, datetime, dict[str, Any]]:
    """A host with one submission, settled by the delivery of its alarm at its deadline."""
    host = Host.objects.create(key=key)
    item = runtime.submit(host, "t1")
    slot = alarm.scheduled(host)
    assert slot is not None
    clock.set(slot)
    result = fire_alarm(host.pk, deadline=slot.isoformat())
    assert item.settled
    return host, slot, result


def test_fire_alarm__a_duplicate_delivery_changes_nothing(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host, slot, first = _settled_by_its_alarm("dup", clock, runtime)
    records = PassRecord.objects.count()
    state = MaintenanceState.objects.get(host=host)
    again = fire_alarm(host.pk, deadline=slot.isoformat())
    assert first["phase"] == "actionable"
    assert again["phase"] == "stale"
    assert PassRecord.objects.count() == records
    after = MaintenanceState.objects.get(host=host)
    assert (after.dirty, after.processed) == (state.dirty, state.processed)


def test_fire_alarm__a_delivery_reads_its_host_inside_the_pass_transaction(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    host, _, _ = _settled_by_its_alarm("one-read", clock, runtime)
    alarm.rearm(host, clock.now() + MS, reason="a slot with nothing due")
    clock.set(clock.now() + 2 * MS)
    deadline = alarm.scheduled(host).isoformat()
    with CaptureQueriesContext(connection) as captured:
        result = fire_alarm(host.pk, deadline=deadline)
    assert result == {**result, "host": "one-read", "phase": "stale"}
    statements = [q["sql"] for q in captured if not q["sql"].startswith(("BEGIN", "COMMIT"))]
    # the lock comes first (on PostgreSQL with the reads, Note [Lock and read in one call])
    assert '"durable_agent_maintenancestate"' in statements[0] or (
        statements[0].startswith(f"SELECT * FROM {rows.FUNCTION}(")
    )
    host_reads = [
        sql for sql in statements if sql.startswith("SELECT") and 'FROM "durable_agent_host"' in sql
    ]
    assert host_reads == []  # the host arrives with the lanes, in the same transaction
    assert alarm.scheduled(host) is None


def test_fire_alarm__a_delivery_fired_ahead_is_held_until_its_deadline() -> None:
    """Note [Fire ahead, run at the deadline]: a delivery within ``FIRE_AHEAD_MS`` of its
    deadline waits for it, so its pass runs (not the early-fire guard) and starts on time."""
    host = Host.objects.create(key="ahead")
    caught_up(host)
    with override_settings(DURABLE_AGENT={**settings.DURABLE_AGENT, "FIRE_AHEAD_MS": 500}):
        gate.schedule(host, LIFECYCLE, timezone.now() + timedelta(milliseconds=300))
        deadline = alarm.scheduled(host)
        assert deadline is not None
        result = fire_alarm(host.pk, deadline=deadline.isoformat())
    assert result["phase"] != "stale"
    record = PassRecord.objects.get(host=host, deadline=deadline)
    assert record.started_at >= deadline
    assert alarm.scheduled(host) is None


def test_fire_alarm__a_delivery_earlier_than_the_lead_is_not_held() -> None:
    host = Host.objects.create(key="too-early")
    caught_up(host)
    gate.schedule(host, LIFECYCLE, timezone.now() + timedelta(seconds=5))
    deadline = alarm.scheduled(host)
    assert deadline is not None
    started = time.monotonic()
    result = fire_alarm(host.pk, deadline=deadline.isoformat())
    assert time.monotonic() - started < 2.5  # the default lead is 10 ms: not held
    assert result["phase"] == "stale"  # the early-fire guard, as before
    assert alarm.scheduled(host) == deadline


def test_fire_alarm__a_deleted_host_is_ignored(clock: FakeClock) -> None:
    assert fire_alarm(424242, deadline=clock.now().isoformat()) == {"host": None, "phase": "stale"}


def test_sweep__re_arms_a_dirty_host_whose_slot_was_lost(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    from durable_agent.tasks import sweep

    host = Host.objects.create(key="lost")
    item = runtime.submit(host, "t1")
    clean = Host.objects.create(key="clean")
    Schedule.objects.update(repeats=0)  # fired by django-q; the task then died before begin
    assert alarm.scheduled(host) is None
    assert sweep() == {"rearmed": 0, **NOTHING_PRUNED}  # its delivery may still be queued
    clock.advance(ms=conf.get("SWEEP_GRACE_MS") + 1000)
    assert sweep() == {"rearmed": 1, **NOTHING_PRUNED}
    assert alarm.scheduled(host) is not None
    assert alarm.scheduled(clean) is None
    drain_alarms(clock)
    assert item.settled
    assert sweep() == {"rearmed": 0, **NOTHING_PRUNED}


def test_sweep__walks_the_hosts_in_pages_of_page_size(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from durable_agent.tasks import sweep

    lost = [Host.objects.create(key=f"lost-{n}") for n in range(5)]
    for host in lost:
        runtime.submit(host, "t1")
    clean = Host.objects.create(key="clean")
    Schedule.objects.all().delete()  # every slot lost (deleted by hand)
    with CaptureQueriesContext(connection) as captured:
        assert sweep(page_size=2) == {"rearmed": 5, **NOTHING_PRUNED}
    pages = [q["sql"] for q in captured.captured_queries if " UNION " in q["sql"]]
    assert len(pages) == 3  # 2 + 2 + 1 hosts: the short page is the last one
    assert all(q.rstrip().endswith("LIMIT 2") for q in pages)
    assert all(alarm.scheduled(host) is not None for host in lost)
    assert alarm.scheduled(clean) is None
    assert sweep(page_size=2) == {"rearmed": 0, **NOTHING_PRUNED}


def test_sweep__applies_a_binding_registry_change(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    from durable_agent.tasks import sweep

    host = Host.objects.create(key="parked")
    item = runtime.submit(host, "t1", behaviour="binding")
    drain_alarms(clock)
    assert alarm.scheduled(host) is None
    item.behaviour = "settle"
    runtime.registry_key = "registry-2"  # a deploy registered the missing agent
    assert sweep()["rearmed"] == 1
    drain_alarms(clock)
    assert item.settled


# -- several hosts per delivered task (Note [Several hosts per delivered task]) ---------------


def _fired_together(hosts: list[Host], clock: FakeClock) -> list[list[Any]]:
    """Disarm the hosts' slots as a firing does and return the delivery ``fire_alarms`` gets."""
    deliveries = [[host.pk, alarm.scheduled(host).isoformat()] for host in hosts]  # type: ignore[union-attr]
    slots = Host.objects.filter(pk__in=[h.pk for h in hosts]).values_list("alarm_id", flat=True)
    Schedule.objects.filter(pk__in=list(slots)).update(repeats=0)
    clock.set(max(datetime.fromisoformat(d) for _, d in deliveries))
    return deliveries


def _hosts_with_due_lane(count: int, clock: FakeClock) -> list[Host]:
    hosts = [Host.objects.create(key=f"together-{i}") for i in range(count)]
    for host in hosts:
        caught_up(host)
        gate.schedule(host, "outbox", clock.now())
    return hosts


def test_fire_alarms__one_hosts_failure_does_not_stop_the_others_and_is_raised_after_them(
    clock: FakeClock,
) -> None:
    from durable_agent import lanes
    from durable_agent.errors import PassError
    from durable_agent.tasks import fire_alarms

    ran: list[int] = []

    def handler(ctx: Any) -> None:
        ran.append(ctx.host.pk)
        if ctx.host.key == "together-1":
            raise RuntimeError("this host's lane fails")

    lanes.register("outbox", handler)
    hosts = _hosts_with_due_lane(3, clock)
    deliveries = _fired_together(hosts, clock)
    with pytest.raises(PassError) as raised:
        fire_alarms(deliveries)
    assert ran == [h.pk for h in hosts]  # in the delivery's order, the third after the failure
    assert str(raised.value).endswith(f"(1 of this delivery's passes failed: hosts {hosts[1].pk})")
    assert "this host's lane fails" in str(raised.value)
    records = {r.host_id: r for r in PassRecord.objects.all()}
    assert sorted(records) == sorted(h.pk for h in hosts)  # each host's pass recorded itself
    assert records[hosts[1].pk].error
    assert not records[hosts[0].pk].error
    assert alarm.scheduled(hosts[1]) is not None  # the failed lane's backoff is armed
    assert alarm.scheduled(hosts[0]) is None
    assert alarm.scheduled(hosts[2]) is None


def test_fire_alarms__a_delivery_past_its_budget_re_arms_the_hosts_of_the_groups_left(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_agent import lanes, tasks

    ran: list[int] = []
    lanes.register("outbox", lambda ctx: ran.append(ctx.host.pk))
    hosts = _hosts_with_due_lane(3, clock)
    deliveries = _fired_together(hosts, clock)
    monkeypatch.setattr(tasks, "BATCH_BUDGET_SECONDS", 0.0)
    monkeypatch.setattr(tasks, "GROUP", 2)
    result = tasks.fire_alarms(deliveries)
    assert ran == [hosts[0].pk, hosts[1].pk]  # the first group always runs, all of it
    assert [r["host"] for r in result["hosts"]] == [hosts[0].key, hosts[1].key]
    slot = alarm.scheduled(hosts[2])  # armed again, due at once, for another delivery
    assert slot is not None
    assert slot <= clock.now() + conf.minimum_alarm_delay()
    assert alarm.scheduled(hosts[0]) is None
    assert alarm.scheduled(hosts[1]) is None


def test_fire_alarms__a_held_delivery_holds_each_host_until_its_own_deadline(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_agent import lanes, tasks

    lanes.register("outbox", lambda ctx: None)
    hosts = _hosts_with_due_lane(2, clock)
    deliveries = _fired_together(hosts, clock)
    held: list[datetime] = []
    monkeypatch.setattr(tasks, "hold_until", held.append)
    tasks.fire_alarms(deliveries)
    assert held == [datetime.fromisoformat(d) for _, d in deliveries]
