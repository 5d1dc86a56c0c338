"""The begins of a delivery's passes in one transaction (Note [A delivery's passes begin
together] in ``durable_agent/tasks.py``)."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from durable_agent import conf, tasks
from durable_agent.maintenance import alarm, failpoints
from durable_agent.maintenance.failpoints import FailpointError
from durable_agent.maintenance.passes.state import Lease, Pass
from durable_agent.maintenance.store import rows
from durable_agent.models import Host, MaintenanceState, PassRecord
from durable_agent.testing import FakeClock
from tests.maintenance.helpers import due_together

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _due_hosts(
    count: int, clock: FakeClock, ran: list[int]
) -> tuple[list[Host], list[tuple[int, datetime]]]:
    """``count`` hosts with an ``outbox`` lane due now whose handler appends the host's id to
    ``ran``, and their delivery (``due_together``)."""
    return due_together(count, clock, lambda ctx: ran.append(ctx.host.pk), key="together")


def _leases() -> dict[int, str | None]:
    """Every host's lease owner, read on a connection of its own (what others see)."""
    seen: dict[int, str | None] = {}

    def read() -> None:
        try:
            seen.update(MaintenanceState.objects.values_list("host_id", "pass_lease_owner"))
        finally:
            connections.close_all()

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(30)
    return seen


def test_fire_alarms__a_groups_hosts_all_hold_their_lease_before_the_first_pass_runs(
    clock: FakeClock,
) -> None:
    ran: list[int] = []
    hosts, pairs = _due_hosts(3, clock, ran)
    deliveries = [[h, when.isoformat()] for h, when in pairs]
    at_first_pass: list[dict[int, str | None]] = []

    def after_begin(name: str) -> None:
        if name == "maintenance:begin:after" and not at_first_pass:
            at_first_pass.append(_leases())

    with failpoints.installed(after_begin):
        tasks.fire_alarms(deliveries)
    assert ran == [h.pk for h in hosts]  # each pass ran, in the delivery's order
    leases = at_first_pass[0]
    assert all(leases[h.pk] for h in hosts), leases  # every begin committed before any pass
    assert not any(_leases().values())  # and each pass gave its lease back
    assert {r.host_id for r in PassRecord.objects.all()} == {h.pk for h in hosts}
    assert all(alarm.scheduled(h) is None for h in hosts)


def test_begin_together__a_host_whose_state_row_is_held_is_left_to_run_alone(
    clock: FakeClock,
) -> None:
    ran: list[int] = []
    hosts, deliveries = _due_hosts(3, clock, ran)
    held, release = threading.Event(), threading.Event()

    def holder() -> None:  # another transaction holds the second host's state row
        try:
            with transaction.atomic():
                MaintenanceState.objects.select_for_update().get(host_id=hosts[1].pk)
                held.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(30)
        begun = tasks.begin_together(deliveries)  # returns without waiting for the lock
    finally:
        release.set()
        thread.join(30)
    assert [p is not None for p in begun] == [True, False, True]
    for (host_id, when), p in zip(deliveries, begun, strict=True):
        if p is None:
            tasks.fire_alarm(host_id, when)
        else:
            tasks._run_begun(host_id, p)
    assert sorted(ran) == sorted(h.pk for h in hosts)
    assert all(alarm.scheduled(h) is None for h in hosts)


def test_fire_alarms__a_failed_begin_rolls_its_group_back_and_each_host_begins_alone(
    clock: FakeClock,
) -> None:
    ran: list[int] = []
    hosts, deliveries = _due_hosts(3, clock, ran)
    with failpoints.installed(failpoints.raise_at("maintenance:begin:before")):
        assert tasks.begin_together(deliveries) == [None, None, None]
        assert not any(_leases().values())  # the group's transaction committed nothing
    with failpoints.installed(failpoints.raise_at("maintenance:begin:before")):
        result = tasks.fire_alarms([[h, when.isoformat()] for h, when in deliveries])
    assert ran == [h.pk for h in hosts]  # the group failed once; each host then began alone
    assert len(result["hosts"]) == 3
    assert all(alarm.scheduled(h) is None for h in hosts)


def test_keep_lease__renews_a_waiting_lease_and_refuses_one_lost_meanwhile(
    clock: FakeClock,
) -> None:
    ran: list[int] = []
    hosts, deliveries = _due_hosts(2, clock, ran)
    first, second = tasks.begin_together(deliveries)
    assert isinstance(first, Pass)
    assert isinstance(second, Pass)
    assert isinstance(first.lease, Lease)
    assert isinstance(second.lease, Lease)
    assert tasks.keep_lease(first)  # fresh: nothing to renew
    assert MaintenanceState.objects.get(host=hosts[0]).pass_lease_expires_at == (
        first.lease.expires_at
    )
    clock.advance(seconds=conf.pass_lease_ttl().total_seconds() / 3 + 1)
    assert tasks.keep_lease(first)  # a third of the TTL waited: renewed
    renewed = MaintenanceState.objects.get(host=hosts[0]).pass_lease_expires_at
    assert renewed == clock.now() + conf.pass_lease_ttl()
    MaintenanceState.objects.filter(host=hosts[1]).update(pass_lease_owner="another pass")
    assert not tasks.keep_lease(second)
    report: dict[str, Any] = tasks._run_begun(hosts[1].pk, second)
    assert report == {"host": hosts[1].key, "phase": "busy"}
    tasks._run_begun(hosts[0].pk, first)
    assert ran == [hosts[0].pk]  # the lost lease's host was not run here


def test_begin_together__a_failure_after_a_begin_rolls_back_the_begins_before_it(
    clock: FakeClock,
) -> None:
    ran: list[int] = []
    hosts, deliveries = _due_hosts(2, clock, ran)
    hits: list[str] = []

    def crash_on_second(name: str) -> None:
        if name == "maintenance:begin:before":
            hits.append(name)
            if len(hits) == 2:
                raise FailpointError(name)

    with failpoints.installed(crash_on_second):
        assert tasks.begin_together(deliveries) == [None, None]
    assert len(hits) == 2  # the first host's begin ran inside the group, then was rolled back
    leases = _leases()
    assert not any(leases[h.pk] for h in hosts)
    assert ran == []


def test_begin_together__the_groups_reads_are_one_call_and_its_writes_one_statement(
    clock: FakeClock,
) -> None:
    """Note [A group's reads in one call], Note [A group's writes in one statement]."""
    ran: list[int] = []
    hosts, deliveries = _due_hosts(4, clock, ran)
    with CaptureQueriesContext(connections["default"]) as captured:
        begun = tasks.begin_together(deliveries)
    assert all(isinstance(p, Pass) and isinstance(p.lease, Lease) for p in begun)
    sql = [q["sql"] for q in captured.captured_queries]
    assert sum("durable_agent_lock_and_read" in s for s in sql) == 1, sql
    assert sum(s.startswith("WITH w0 AS (") for s in sql) == 1, sql
    assert rows._pending.ahead == {}  # nothing of the group's reads outlives it
    for p in begun:  # every begin wrote what it writes alone: its lease, its slot
        assert p is not None
        state = MaintenanceState.objects.get(host_id=p.host.pk)
        assert isinstance(p.lease, Lease)
        assert state.pass_lease_owner == p.lease.owner
        slot = alarm.scheduled(p.host)  # the backstop, armed by the group's writes
        assert slot is not None
        assert slot > clock.now()
    for (host_id, _), p in zip(deliveries, begun, strict=True):
        assert p is not None
        tasks._run_begun(host_id, p)
    assert ran == [h.pk for h in hosts]
    assert all(alarm.scheduled(h) is None for h in hosts)
