"""The process-death variant of the crash matrix: a child process dies (``os._exit``) at a
failpoint; this process then fires alarms until quiet. PostgreSQL: the child shares the
committed test database."""

from __future__ import annotations

import pytest

from durable_agent.maintenance import alarm, ensure_alarm, failpoints
from durable_agent.maintenance.operators.audit import audit_host
from durable_agent.models import Host, MaintenanceState, MutationTicket, Submission
from durable_agent.testing import FakeClock
from tests.maintenance.helpers import drain
from tests.procs import run_python

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# A mutation, two admissions (the first left by a dead attempt), a pass that recovers the
# thread and settles a head, and the constructor gate.
FLOW = """
import os
import durable_agent
from durable_agent import tasks
from durable_agent.maintenance import ensure_alarm, failpoints, gate, run_pass

def die(name):
    if name == {location!r}:
        os._exit(17)

with failpoints.installed(die):
    with gate.mutation({host}, lanes=("agent:lifecycle",)):
        gate.schedule({host}, "agent:lifecycle", gate_now())
    for n in range(2):
        durable_agent.submit(
            host={host}, thread="t1", agent="summarise", payload={{"text": str(n)}}
        )
    # The first one's attempt died with its lease: the pass recovers the thread first.
    first = Submission.objects.filter(host={host}).order_by("sequence").first()
    Submission.objects.filter(pk=first.pk).update(
        state="running", lease_owner="dead", lease_expires_at=gate_now() - timedelta(seconds=1)
    )
    # A delivery of several hosts' slots (here one), as the broker hands them out.
    tasks.fire_alarms([[{host}, gate_now().isoformat()]])
    run_pass({host})
    ensure_alarm({host})
"""
PRELUDE = (
    "from datetime import timedelta\n"
    "from durable_agent import clock\n"
    "from durable_agent.models import Submission\n"
    "gate_now = clock.now\n"
)
REACHED = sorted(
    set(failpoints.LOCATIONS)
    - {
        "maintenance:binding-retry:before",
        "maintenance:binding-retry:after",
        "maintenance:retry:before",
        "maintenance:retry:after",
    }
)


@pytest.mark.parametrize("location", REACHED)
def test_process_death__converges_after_the_child_dies(clock: FakeClock, location: str) -> None:
    host = Host.objects.create(key=f"dies-{location.replace(':', '-')}")
    child = run_python(PRELUDE + FLOW.format(location=location, host=host.pk))
    assert child.returncode == 17, f"the flow never reached {location}: {child.stderr[-2000:]}"
    if MaintenanceState.objects.filter(host=host).exists():
        audit = audit_host(Host.objects.select_related("alarm").get(pk=host.pk))
        assert audit.ok, audit.violations
    clock.advance(minutes=2)  # past the dead process's leases and tickets
    ensure_alarm(host)  # what the sweep does for a host whose slot django-q consumed
    drain(host, clock, limit=300)
    rows = list(Submission.objects.filter(host=host).values_list("state", "outcome"))
    assert all(r == ("settled", "completed") for r in rows), rows
    state = MaintenanceState.objects.get(host=host)
    assert state.dirty == state.processed
    assert alarm.scheduled(host) is None
    assert not MutationTicket.objects.filter(host=host).live(now=clock.now()).exists()


# Two hosts' slots fired together, delivered to one task, whose passes begin in one
# transaction (Note [A delivery's passes begin together] in
# durable_agent/tasks.py); the child dies after that commit, before the
# first pass's handler.
GROUP_FLOW = """
import os
import time
from django_q.models import Schedule
from durable_agent import lanes, tasks
from durable_agent.maintenance import alarm, failpoints, gate
from durable_agent.models import Host

def die(name):
    if name == "maintenance:begin:after":
        os._exit(17)

lanes.register("outbox", lambda ctx: None)
hosts = [{first}, {second}]
for host in hosts:
    gate.schedule(host, "outbox", gate_now())
deliveries = [[h, alarm.scheduled(h).isoformat()] for h in hosts]
slots = Host.objects.filter(pk__in=hosts).values_list("alarm_id", flat=True)
Schedule.objects.filter(pk__in=list(slots)).update(repeats=0)  # fired, as the broker fires them
time.sleep(0.2)  # past their deadlines
with failpoints.installed(die):
    tasks.fire_alarms(deliveries)
"""


def test_process_death__a_group_begun_together_leaves_every_host_armed(
    clock: FakeClock,
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from durable_agent import conf, lanes
    from durable_agent.models import DueLane
    from tests.maintenance.helpers import caught_up

    ran: list[int] = []
    lanes.register("outbox", lambda ctx: ran.append(ctx.host.pk))
    hosts = [Host.objects.create(key=f"group-dies-{i}") for i in range(2)]
    for host in hosts:
        caught_up(host)
    started = timezone.now()
    child = run_python(PRELUDE + GROUP_FLOW.format(first=hosts[0].pk, second=hosts[1].pk))
    assert child.returncode == 17, f"the flow never reached its failpoint: {child.stderr[-2000:]}"
    for host in hosts:  # both begins committed: each slot armed within its lease, none lost
        audit = audit_host(Host.objects.select_related("alarm").get(pk=host.pk))
        assert audit.ok, audit.violations
        slot = alarm.scheduled(host)
        assert slot is not None
        assert slot <= started + conf.pass_lease_ttl() + timedelta(seconds=5)
        assert MaintenanceState.objects.get(host=host).pass_lease_owner  # the dead one's lease
    assert clock.now() > timezone.now() + conf.pass_lease_ttl()  # this process runs later
    for host in hosts:
        drain(host, clock, limit=50)
    assert sorted(ran) == sorted(h.pk for h in hosts)  # each lane ran once its lease expired
    assert not DueLane.objects.filter(host__in=hosts, due_at__isnull=False).exists()
    assert all(alarm.scheduled(h) is None for h in hosts)


# The same group, the child dying after both handlers ran, before the transaction that
# finishes both passes (Note [A group's finishes together] in
# durable_agent/maintenance/passes/waves.py).
GROUP_FINISH_FLOW = GROUP_FLOW.replace(
    'lanes.register("outbox", lambda ctx: None)',
    "def outbox(ctx):\n"
    '    Host.objects.create(key="ran-" + str(ctx.host.pk))\n'
    "\n"
    'lanes.register("outbox", outbox)',
).replace('"maintenance:begin:after"', '"maintenance:finish:before"')


def test_process_death__a_group_dying_before_its_finish_runs_each_handler_again(
    clock: FakeClock,
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from durable_agent import conf, lanes
    from durable_agent.maintenance import run_pass
    from durable_agent.models import DueLane, PassRecord
    from tests.maintenance.helpers import caught_up

    assert GROUP_FINISH_FLOW != GROUP_FLOW
    ran: list[int] = []
    lanes.register("outbox", lambda ctx: ran.append(ctx.host.pk))
    hosts = [Host.objects.create(key=f"group-finish-dies-{i}") for i in range(2)]
    for host in hosts:
        caught_up(host)
        run_pass(host)  # stores the registry key: the child's passes have one wave each
    started = timezone.now()
    child = run_python(PRELUDE + GROUP_FINISH_FLOW.format(first=hosts[0].pk, second=hosts[1].pk))
    assert child.returncode == 17, f"the flow never reached its failpoint: {child.stderr[-2000:]}"
    for host in hosts:
        assert Host.objects.filter(key=f"ran-{host.pk}").exists()  # its handler ran and wrote
        audit = audit_host(Host.objects.select_related("alarm").get(pk=host.pk))
        assert audit.ok, audit.violations
        slot = alarm.scheduled(host)  # armed by the group's begin, within the lease
        assert slot is not None
        assert slot <= started + conf.pass_lease_ttl() + timedelta(seconds=5)
        assert DueLane.objects.get(host=host, lane="outbox").due_at is not None
        assert PassRecord.objects.filter(host=host).count() == 1  # the setup's: none finished
    assert clock.now() > timezone.now() + conf.pass_lease_ttl()  # this process runs later
    for host in hosts:
        drain(host, clock, limit=50)
    assert sorted(ran) == sorted(h.pk for h in hosts)  # each handler once more, then done
    assert not DueLane.objects.filter(host__in=hosts, due_at__isnull=False).exists()
    assert all(alarm.scheduled(h) is None for h in hosts)
