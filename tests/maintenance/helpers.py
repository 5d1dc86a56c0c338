"""Helpers shared by the pass tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django_q.models import Schedule

from durable_agent import lanes
from durable_agent.maintenance import alarm, gate, run_alarm_transaction
from durable_agent.maintenance.passes import PassReport, run_pass
from durable_agent.models import Host, MaintenanceState
from durable_agent.testing import FakeClock


def caught_up(host: Host) -> None:
    """Acknowledge everything and idle the native lane, as a finished pass would."""

    def fn(tx):
        state, queue, checkpoint = tx.state, tx.queue, tx.checkpoint
        state.processed = state.dirty
        queue.checkpoint_native(None)
        checkpoint.cancel()

    run_alarm_transaction(host, "test caught up", fn)


def generations(host: Host) -> tuple[int, int]:
    state = MaintenanceState.objects.get(host=host)
    return state.dirty, state.processed


@dataclass
class Drain:
    reports: list[PassReport] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    @property
    def passes(self) -> int:
        return len(self.reports) + len(self.errors)


def drain(host: Host, clock: FakeClock, *, limit: int = 200) -> Drain:
    """Fire the host's alarm (as django-q would, with the guard) until its slot is disarmed.

    Failures are collected, not raised: the alarm must stay armed after each one.
    """
    result = Drain()
    for _ in range(limit):
        slot = alarm.scheduled(host)
        if slot is None:
            return result
        if slot > clock.now():
            clock.set(slot)
        try:
            result.reports.append(run_pass(host, deadline=slot, guard=True))
        except Exception as exc:
            result.errors.append(exc)
    raise AssertionError(f"the alarm of {host} did not settle after {limit} firings")


def due_together(
    count: int,
    clock: FakeClock,
    handler: Callable[[Any], Any],
    *,
    key: str,
    one_wave: bool = False,
) -> tuple[list[Host], list[tuple[int, datetime]]]:
    """``count`` caught-up hosts (keys ``{key}-0``, ...), each with an ``outbox`` lane due now
    run by ``handler``, and their delivery: their slots fired, as the broker fires them, and
    the clock at the latest deadline. ``one_wave``: a first pass stores the registry key, so
    the delivery's passes have only the wave to run."""
    lanes.register("outbox", handler)
    hosts = [Host.objects.create(key=f"{key}-{i}") for i in range(count)]
    deliveries = []
    for host in hosts:
        caught_up(host)
        if one_wave:
            run_pass(host)
        gate.schedule(host, "outbox", clock.now())
        when = alarm.scheduled(host)
        assert when is not None
        deliveries.append((host.pk, when))
    slots = Host.objects.filter(pk__in=[h.pk for h in hosts]).values_list("alarm_id", flat=True)
    Schedule.objects.filter(pk__in=list(slots)).update(repeats=0)
    clock.set(max(when for _, when in deliveries))
    return hosts, deliveries
