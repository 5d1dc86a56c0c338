"""The finishes of a group's one-wave passes in one transaction (Note [A group's finishes
together] in ``durable_agent/maintenance/passes/waves.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from durable_agent import tasks
from durable_agent.errors import PassError
from durable_agent.maintenance import alarm
from durable_agent.maintenance.passes import waves
from durable_agent.models import DueLane, Host, MaintenanceState, PassRecord
from durable_agent.testing import FakeClock
from tests.maintenance.helpers import due_together

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RECORD = 'INSERT INTO "durable_agent_passrecord"'


def _deliver(count: int, clock: FakeClock, handler: Any) -> tuple[list[Host], list[list[Any]]]:
    """``count`` hosts whose only work is an ``outbox`` lane due now run by ``handler``, and
    their delivery as ``fire_alarms`` takes it."""
    hosts, pairs = due_together(count, clock, handler, key="finish-together", one_wave=True)
    return hosts, [[h, when.isoformat()] for h, when in pairs]


def _last_record() -> int:
    return max(PassRecord.objects.values_list("id", flat=True), default=0)


def _phases_since(last: int, hosts: list[Host]) -> list[str]:
    """The phases of the passes of ``hosts`` recorded after record ``last``, in id order."""
    found = PassRecord.objects.filter(host__in=hosts, id__gt=last).order_by("id")
    return list(found.values_list("phase", flat=True))


def _settled(host: Host) -> bool:
    """The host's wave completed and its pass finished: lane done, lease back, slot clear."""
    lane = DueLane.objects.get(host=host, lane="outbox")
    state = MaintenanceState.objects.get(host=host)
    return lane.due_at is None and state.pass_lease_owner is None and alarm.scheduled(host) is None


def test_fire_alarms__a_groups_waves_finish_in_one_statement_after_every_handler(
    clock: FakeClock,
) -> None:
    order: list[str] = []
    hosts, delivery = _deliver(4, clock, lambda ctx: order.append(f"ran {ctx.host.pk}"))
    before = _last_record()
    with CaptureQueriesContext(connections["default"]) as captured:
        result = tasks.fire_alarms(delivery)
    assert order == [f"ran {h.pk}" for h in hosts]
    assert [r["phase"] for r in result["hosts"]] == ["caught-up"] * 4
    assert all(_settled(h) for h in hosts)
    assert _phases_since(before, hosts) == ["caught-up"] * 4
    sql = [q["sql"] for q in captured.captured_queries]
    finishes = [s for s in sql if RECORD in s]
    assert len(finishes) == 1, sql  # the four finishes' writes: one statement
    assert finishes[0].count(RECORD) == 4
    # the group's begin and its finish: one lock-and-read call each
    assert sum("durable_agent_lock_and_read" in s for s in sql) == 2, sql


def test_fire_alarms__a_failing_handler_fails_its_pass_alone(clock: FakeClock) -> None:
    ran: list[int] = []
    failing: list[int] = []

    def handler(ctx: Any) -> None:
        ran.append(ctx.host.pk)
        if ctx.host.pk in failing:
            raise RuntimeError("the outbox is down")

    hosts, delivery = _deliver(4, clock, handler)
    failing.append(hosts[1].pk)
    before = _last_record()
    with pytest.raises(PassError, match="the outbox is down") as raised:
        tasks.fire_alarms(delivery)
    assert "1 of this delivery's passes failed" in str(raised.value)
    assert ran == [h.pk for h in hosts]  # the others' handlers ran after it
    for host in hosts:
        phases = _phases_since(before, [host])
        if host.pk in failing:
            assert phases == ["failed"]
            lane = DueLane.objects.get(host=host, lane="outbox")
            assert lane.due_at is not None  # backed off, due again
            assert MaintenanceState.objects.get(host=host).pass_lease_owner is None
            assert alarm.scheduled(host) is not None
        else:
            assert phases == ["caught-up"]
            assert _settled(host)


def test_fire_alarms__a_failed_group_finish_finishes_each_pass_alone(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[int] = []
    hosts, delivery = _deliver(3, clock, lambda ctx: ran.append(ctx.host.pk))

    def broken(host_ids: Any) -> Any:
        raise RuntimeError("the group's read failed")

    monkeypatch.setattr(waves, "lock_and_read_many", broken)
    with CaptureQueriesContext(connections["default"]) as captured:
        result = tasks.fire_alarms(delivery)
    monkeypatch.undo()
    assert ran == [h.pk for h in hosts]  # each handler once
    assert [r["phase"] for r in result["hosts"]] == ["caught-up"] * 3
    assert all(_settled(h) for h in hosts)
    finishes = [q["sql"] for q in captured.captured_queries if RECORD in q["sql"]]
    assert [s.count(RECORD) for s in finishes] == [1, 1, 1]  # each finished alone
