"""Concurrent gated mutations on PostgreSQL: real connections, real row locks, real processes."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest
from django_q.models import Schedule

from durable_agent.maintenance import alarm, gate
from durable_agent.models import DueLane, Host, MaintenanceState, MutationTicket
from durable_agent.testing import FakeClock
from tests.maintenance.helpers import caught_up
from tests.procs import run_python
from tests.threads import run_threads

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
THREADS = 8
PER_THREAD = 12
S = timedelta(seconds=1)


def one_armed_slot(host: Host) -> datetime | None:
    host.refresh_from_db()
    assert Schedule.objects.filter(name=f"durable_agent:host:{host.pk}").count() == 1
    assert Schedule.objects.get(pk=host.alarm_id).repeats == 1
    return alarm.scheduled(host)


@pytest.mark.parametrize("host_count", [1, 3])
def test_mutations__no_lost_generation_and_one_slot(clock: FakeClock, host_count: int) -> None:
    hosts = [Host.objects.create(key=f"h{i}") for i in range(host_count)]
    for host in hosts:
        caught_up(host)
    start = {h.pk: MaintenanceState.objects.get(host=h).dirty for h in hosts}

    def work(i: int) -> None:
        for j in range(PER_THREAD):
            host = hosts[(i + j) % host_count]
            with gate.mutation(host), gate.transaction(host) as tx:
                tx.schedule(f"lane-{i % 3}", clock.now() + (10 + j) * S)

    run_threads(work, THREADS)

    total = THREADS * PER_THREAD
    per_host = {h.pk: 0 for h in hosts}
    for i in range(THREADS):
        for j in range(PER_THREAD):
            per_host[hosts[(i + j) % host_count].pk] += 1
    assert sum(per_host.values()) == total
    for host in hosts:
        state = MaintenanceState.objects.get(host=host)
        assert state.dirty == start[host.pk] + per_host[host.pk]
        # The native lane is due now: the slot holds it (never later than any request).
        assert one_armed_slot(host) == clock.now()
    assert MutationTicket.objects.count() == 0


@pytest.mark.parametrize("host_count", [1, 3])
def test_schedules__slot_holds_the_earliest_requested_deadline(
    clock: FakeClock, host_count: int
) -> None:
    hosts = [Host.objects.create(key=f"s{i}") for i in range(host_count)]
    for host in hosts:
        caught_up(host)
    rng = random.Random(7)
    requests = {
        (i, j): (
            hosts[rng.randrange(host_count)],
            clock.now() + rng.randint(1_000, 600_000) * S / 1000,
        )
        for i in range(THREADS)
        for j in range(PER_THREAD)
    }

    def work(i: int) -> None:
        for j in range(PER_THREAD):
            host, due = requests[(i, j)]
            if j % 2:
                gate.schedule(host, f"lane-{j % 4}", due)
            else:
                with gate.transaction(host) as tx:
                    tx.schedule(f"lane-{j % 4}", due)

    run_threads(work, THREADS)

    for host in hosts:
        mine = [due for (h, due) in requests.values() if h.pk == host.pk]
        assert one_armed_slot(host) == min(mine)
        for lane_id in {f"lane-{j % 4}" for j in range(PER_THREAD)}:
            wanted = [
                due
                for (i, j), (h, due) in requests.items()
                if h.pk == host.pk and f"lane-{j % 4}" == lane_id
            ]
            if wanted:
                assert DueLane.objects.get(host=host, lane=lane_id).due_at == min(wanted)
        assert (
            MaintenanceState.objects.get(host=host).dirty
            == MaintenanceState.objects.get(host=host).processed
        )


def test_mutation__process_death_after_prearm_leaves_dirty_and_armed(clock: FakeClock) -> None:
    host = Host.objects.create(key="dies")
    caught_up(host)
    dirty = MaintenanceState.objects.get(host=host).dirty
    result = run_python(
        f"""
        import os
        from durable_agent.maintenance import failpoints, gate

        def die(name):
            if name == "maintenance:mutation:armed":
                os._exit(17)

        with failpoints.installed(die):
            with gate.mutation({host.pk}):
                raise SystemExit("the body must not run")
        """
    )
    assert result.returncode == 17, result.stderr
    state = MaintenanceState.objects.get(host=host)
    assert state.dirty == dirty + 1 > state.processed
    assert alarm.scheduled(host) is not None
    ticket = MutationTicket.objects.get(host=host)  # the dead process never released it
    assert ticket.expires_at - ticket.created_at == 60 * S
