"""A queued delivery holds the slot (Note [A queued delivery holds the slot] in
``durable_agent/maintenance/store/rows.py``): no second delivery while one waits."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from durable_agent import lanes
from durable_agent.broker import AlarmBroker
from durable_agent.maintenance import alarm, failpoints, gate, passes
from durable_agent.maintenance.lane_ids import LIFECYCLE
from durable_agent.maintenance.mutations import commit_function
from durable_agent.maintenance.operators.audit import audit_all, audit_host
from durable_agent.models import Host, MaintenanceState
from tests.maintenance.helpers import caught_up
from tests.qdrive import run_enqueued

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["python path", pytest.param("commit function", marks=pytest.mark.postgres)])
def producer_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a producer's commit writes the slot (the commit function: PostgreSQL only)."""
    if request.param == "python path":
        monkeypatch.setattr(commit_function, "enabled", False)
    else:
        assert commit_function.available()
    return str(request.param)


@pytest.fixture
def ran() -> list[int]:
    seen: list[int] = []
    lanes.register("outbox", lambda ctx: seen.append(ctx.host.pk))
    return seen


def _broker() -> AlarmBroker:
    broker = AlarmBroker()
    broker.listen = False
    broker._next_sweep = float("inf")
    return broker


def _fired(key: str, *, ago: timedelta = timedelta(seconds=1)) -> tuple[Host, Schedule]:
    """A caught-up host whose lifecycle lane came due ``ago`` and whose slot the broker fired:
    its delivery waits in the queue, not begun."""
    host = Host.objects.create(key=key)
    caught_up(host)
    gate.schedule(host, LIFECYCLE, timezone.now() - ago)
    slot_id = Host.objects.get(pk=host.pk).alarm_id
    Schedule.objects.filter(pk=slot_id).update(next_run=timezone.now() - ago)
    assert len(_broker().dequeue()) == 1
    slot = Schedule.objects.get(pk=slot_id)
    assert (slot.repeats, bool(slot.task)) == (0, True)
    return host, slot


def _slot(host: Host) -> Schedule:
    return Schedule.objects.get(pk=Host.objects.get(pk=host.pk).alarm_id)


def test_queued_delivery__a_producer_leaves_the_fired_slot_and_the_delivery_runs_its_work(
    producer_path: str, ran: list[int]
) -> None:
    host, fired = _fired("queued")
    gate.schedule(host, "outbox", timezone.now())  # new work while the delivery waits
    slot = _slot(host)
    assert (slot.repeats, slot.task, slot.next_run) == (0, fired.task, fired.next_run)
    assert _broker().fire_alarm_batch() == 0  # nothing armed: no second delivery
    assert OrmQ.objects.count() == 1
    assert audit_host(Host.objects.get(pk=host.pk)).ok  # the queued delivery counts as the alarm
    assert audit_all().ok
    run_enqueued()  # the one delivery's pass sees what was committed before it began
    assert ran == [host.pk]
    assert _slot(host).task is None
    assert alarm.scheduled(host) is None  # nothing left to do


def test_queued_delivery__past_the_sweep_grace_it_is_lost_and_a_producer_arms_the_slot(
    producer_path: str,
) -> None:
    grace = timedelta(milliseconds=int(settings.DURABLE_AGENT.get("SWEEP_GRACE_MS", 60_000)))
    host, _ = _fired("lost", ago=grace + timedelta(seconds=1))
    assert not audit_host(Host.objects.get(pk=host.pk)).ok  # owed work, the delivery presumed lost
    gate.schedule(host, "outbox", timezone.now())
    slot = _slot(host)
    assert (slot.repeats, slot.task) == (1, None)
    assert audit_host(Host.objects.get(pk=host.pk)).ok


def test_queued_delivery__the_rule_is_off_with_a_grace_of_zero(producer_path: str) -> None:
    host, _ = _fired("no-grace")
    with override_settings(DURABLE_AGENT={**settings.DURABLE_AGENT, "SWEEP_GRACE_MS": 0}):
        gate.schedule(host, "outbox", timezone.now())
    assert (_slot(host).repeats, _slot(host).task) == (1, None)


def test_queued_delivery__a_prompt_pass_spends_it_and_the_late_delivery_changes_nothing(
    ran: list[int],
) -> None:
    host, _ = _fired("prompt")
    gate.schedule(host, "outbox", timezone.now())
    passes.run_pass(host.pk, prompt=True)  # another way in ran the work first
    assert ran == [host.pk]
    assert _slot(host).task is None
    results = run_enqueued()
    assert [r["phase"] for r in results] == ["stale"]
    assert ran == [host.pk]


def test_queued_delivery__the_lease_spends_it_and_arms_the_backstop_in_the_same_commit(
    ran: list[int],
) -> None:
    """What a pass that dies right after its begin leaves: the slot armed at the lease's
    expiry, not the queued delivery that is now running (a death would leave it to the
    sweep's grace)."""
    host, _ = _fired("begin")
    gate.schedule(host, "outbox", timezone.now())
    seen: list[tuple[int, str | None, Any, Any]] = []

    def at_begin(name: str) -> None:
        if name == "maintenance:begin:after":
            slot, state = _slot(host), MaintenanceState.objects.get(host=host)
            seen.append((slot.repeats, slot.task, slot.next_run, state.pass_lease_expires_at))

    with failpoints.installed(at_begin):
        run_enqueued()
    ((repeats, task, next_run, lease_end),) = seen
    assert (repeats, task) == (1, None)
    assert next_run <= lease_end  # the backstop: no later than the lease's expiry
    assert ran == [host.pk]


def test_queued_delivery__a_batch_out_of_time_re_arms_the_hosts_it_did_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from durable_agent import tasks

    hosts = [_fired(f"budget-{i}")[0] for i in range(3)]
    deliveries: list[list[Any]] = [[h.pk, _slot(h).next_run.isoformat()] for h in hosts]
    OrmQ.objects.all().delete()  # the three single deliveries, replaced by one batch
    monkeypatch.setattr(tasks, "BATCH_BUDGET_SECONDS", 0.0)
    monkeypatch.setattr(tasks, "GROUP", 1)  # a group of one host: the budget after it
    tasks.fire_alarms(deliveries)
    assert _slot(hosts[0]).task is None
    for host in hosts[1:]:  # their queued delivery was this one: armed again, not left queued
        slot = _slot(host)
        assert (slot.repeats, slot.task) == (1, None)
