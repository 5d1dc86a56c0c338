"""One pass per host at a time, across threads and processes, on PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from durable_agent import lanes
from durable_agent.maintenance import alarm, gate, run_pass
from durable_agent.models import DueLane, Host, MaintenanceState
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.maintenance.helpers import caught_up, drain
from tests.procs import run_python

pytestmark = [pytest.mark.postgres, pytest.mark.threads, pytest.mark.django_db(transaction=True)]


def test_lease__a_second_pass_in_another_process_is_busy(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host = Host.objects.create(key="leased")
    entered, release = threading.Event(), threading.Event()

    def blocking(ctx):
        entered.set()
        assert release.wait(30)

    lanes.register("slow", blocking)
    caught_up(host)
    gate.schedule(host, "slow", clock.now())
    reports = []

    def first() -> None:
        try:
            reports.append(run_pass(host))
        finally:
            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert entered.wait(30)
        child = run_python(
            f"""
            from durable_agent import runtime
            from durable_agent.maintenance import run_pass
            from durable_agent.testing import ScriptedRuntime
            runtime.install(ScriptedRuntime())
            print(run_pass({host.pk}).phase)
            """
        )
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "busy"
        state = MaintenanceState.objects.get(host=host)
        # The busy delivery left the slot armed no later than the running lease's expiry.
        assert alarm.scheduled(host) <= state.pass_lease_expires_at
    finally:
        release.set()
        thread.join(30)
    assert reports[0].phase in ("caught-up", "actionable")
    assert DueLane.objects.get(host=host, lane="slow").state == "idle"
    assert MaintenanceState.objects.get(host=host).pass_lease_owner is None


def test_pool__two_heads_run_in_parallel_threads(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host = Host.objects.create(key="pool")
    both = threading.Barrier(2, timeout=30)

    def meet(item):
        both.wait()  # only passes if both attempts run at the same time
        return "completed"

    items = [runtime.submit(host, t, behaviour=meet) for t in ("a", "b")]
    report = run_pass(host)
    assert report.settled == 2
    assert all(i.settled for i in items)
    drain(host, clock)
    assert alarm.scheduled(host) is None
