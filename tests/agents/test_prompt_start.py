"""Note [Prompt start]: a prompt pass runs fresh work at once, before the slot's backstop time,
and writes nothing when there is nothing to do or another pass holds the lease."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import durable_agent
from durable_agent import tasks
from durable_agent.errors import PassError
from durable_agent.maintenance import alarm, failpoints, run_pass
from durable_agent.models import Host, MaintenanceState, PassRecord, Submission
from durable_agent.testing import FakeClock
from tests.agents.conftest import drain, generation

pytestmark = pytest.mark.django_db


def state_row(host: Host) -> dict[str, Any]:
    return MaintenanceState.objects.filter(host=host).values().get()


def test_prompt_start__runs_fresh_work_before_the_backstop_fires(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    backstop = alarm.scheduled(host)
    assert backstop == clock.now() + timedelta(milliseconds=50)  # the minimum delay

    report = tasks.prompt_pass(host.pk)  # at once: the slot's time has not come

    assert report["phase"] == "actionable"
    assert calls == [("echo", 1)]
    assert Submission.objects.get(pk=receipt.submission_id).state == "settled"
    assert alarm.scheduled(host) is None  # the backstop went with the work
    dirty, processed = generation(host) or (0, 0)
    assert dirty == processed


def test_prompt_start__with_nothing_due_it_writes_nothing(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    run_pass(host)  # the work is done: a second cluster's hint finds nothing
    before = state_row(host)
    records = PassRecord.objects.count()

    report = run_pass(host, prompt=True)

    assert report.phase == "stale"
    assert state_row(host) == before
    assert PassRecord.objects.count() == records
    assert alarm.scheduled(host) is None


def test_prompt_start__while_a_pass_holds_the_lease_it_writes_nothing(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    holder = clock.now() + timedelta(minutes=5)
    MaintenanceState.objects.filter(host=host).update(
        pass_lease_owner="another-cluster", pass_lease_expires_at=holder
    )
    before = state_row(host)
    slot = alarm.scheduled(host)
    records = PassRecord.objects.count()

    report = run_pass(host, prompt=True)

    assert report.phase == "busy"
    assert calls == []
    assert state_row(host) == before
    assert alarm.scheduled(host) == slot  # the backstop stays armed
    assert PassRecord.objects.count() == records


def test_prompt_start__an_alarm_delivery_for_the_backstop_then_finds_nothing(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    backstop = alarm.scheduled(host)
    assert backstop is not None
    run_pass(host, prompt=True)

    clock.set(backstop)
    report = run_pass(host, deadline=backstop, guard=True)  # a delivery fired before the move

    assert report.phase == "stale"
    assert calls == [("echo", 1)]  # once


@pytest.mark.parametrize(
    "location",
    [
        "maintenance:begin:before",
        "maintenance:begin:after",
        "maintenance:select:before",
        "maintenance:checkpoint:before",
        # The checkpoint finishes this pass (Note [The checkpoint finishes a pass that has
        # nothing after it]): after it the lease is given back and the slot decided.
        "maintenance:checkpoint:after",
    ],
)
def test_prompt_start__a_prompt_pass_that_fails_anywhere_leaves_the_work_to_the_slot(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any], location: str
) -> None:
    """Goal: the backstop is unchanged when the prompt path is lost mid-way."""
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)

    with failpoints.installed(failpoints.raise_at(location)), pytest.raises(PassError):
        tasks.prompt_pass(host.pk)

    dirty, processed = generation(host) or (0, 0)
    if dirty > processed:  # owed: the backstop (or the failure's backoff) is armed
        assert alarm.scheduled(host) is not None
    drain(host, clock)
    assert calls == [("echo", 1)]  # run once, by whichever pass got there
    dirty, processed = generation(host) or (0, 0)
    assert dirty == processed
