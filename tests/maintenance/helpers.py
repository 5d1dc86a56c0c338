"""Helpers shared by the pass tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from durable_agent.maintenance import alarm, run_alarm_transaction
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
