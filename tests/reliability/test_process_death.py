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
