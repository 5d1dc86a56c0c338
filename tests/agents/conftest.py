from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from durable_agent.agents import registry
from durable_agent.agents.runtime import ReferenceRuntime
from durable_agent.maintenance import alarm, run_pass
from durable_agent.maintenance.passes import PassReport
from durable_agent.models import Host, MaintenanceState
from durable_agent.testing import FakeClock


@pytest.fixture(autouse=True)
def _empty_agent_registry() -> Iterator[None]:
    """Every test starts with no agents registered and leaves the registry as it found it."""
    saved = registry.snapshot()
    registry.restore({})
    yield
    registry.restore(saved)


@pytest.fixture
def reference() -> ReferenceRuntime:
    return ReferenceRuntime()


@pytest.fixture
def calls() -> list[tuple[str, Any]]:
    """(agent name, payload) of every agent run, in order."""
    return []


@pytest.fixture
def echo(calls: list[tuple[str, Any]]) -> Callable[..., Any]:
    """The agent ``echo`` v1: records its run and returns its payload."""

    @registry.agent("echo", version="1")
    def echo(ctx: Any, payload: Any) -> Any:
        calls.append(("echo", payload))
        return payload

    return echo


def generation(host: Host) -> tuple[int, int] | None:
    """(dirty, processed) of the host, or None before its state row exists."""
    state = MaintenanceState.objects.filter(host=host).first()
    return None if state is None else (state.dirty, state.processed)


def later(clock: FakeClock, minutes: int = 10) -> datetime:
    return clock.now() + timedelta(minutes=minutes)


def drain(host: Host, clock: FakeClock, limit: int = 30) -> list[PassReport]:
    """Run passes at each alarm time until the host's slot is clear."""
    reports: list[PassReport] = []
    for _ in range(limit):
        due = alarm.scheduled(host)
        if due is None:
            return reports
        if due > clock.now():
            clock.set(due)
        reports.append(run_pass(host))
    raise AssertionError(f"the host did not quiesce after {limit} passes: {reports[-3:]}")
