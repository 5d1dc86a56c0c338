"""The state the phases of the native step share, and what the step starts from and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from durable_agent.maintenance.lanes.pool import Executor
from durable_agent.maintenance.lanes.recovery import NativeRecovery
from durable_agent.models import Host
from durable_agent.runtime import Runtime


@dataclass(frozen=True)
class Started:
    """What ``begin_pass`` found: caught up, or actionable with the charged native revision."""

    actionable: bool
    generation: int
    nonterminal: int
    active_at_start: int = 0
    source_revision: int | None = None
    stalls: int = 0


@dataclass
class NativeResult:
    phase: str
    nonterminal: int
    next_at: datetime | None
    settled: int = 0


@dataclass
class NativeState:
    """What the phases of one host's native step share: the pass's host, runtime and start,
    its recovery state and what its attempts settled."""

    host: Host
    runtime: Runtime
    started: Started
    yield_after: datetime
    executor: Executor
    recovery: NativeRecovery = field(default_factory=NativeRecovery)
    settled: int = 0
    progressed: bool = False

    @property
    def slots(self) -> int:
        return 1 if self.host.single_thread else 2
