"""The pass: one object per maintenance pass of one host, built by its begin.

``Pass`` holds everything the phases of one pass share: the host and runtime, the lease,
the window (its times, one name each), what the begin transaction read under the host's
locks, what the pass charged and saw of the lanes (``rearm_failure`` must not charge a lane
twice, and a wave acknowledges only the revision it saw), the native step's recovery and what
its attempts settled, and the executor its waves and attempts run on. The phases are functions
of it: ``begin`` (``passes/run.py``), the native step (``passes/native.py``), the waves
(``passes/waves.py``) and the finish (``passes/finish.py``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from durable_agent import conf
from durable_agent.maintenance.passes.lane_registry import LaneSpec
from durable_agent.maintenance.passes.pool import Executor
from durable_agent.maintenance.passes.recovery import NativeRecovery
from durable_agent.maintenance.store.lease import Busy, Lease, Stale
from durable_agent.maintenance.types import Lane
from durable_agent.models import Host
from durable_agent.runtime import Runtime


@dataclass(eq=False)
class Pass:
    """One maintenance pass of one host (docs/pass.md).

    The window, one name per time: ``started_at`` (the pass began), ``slot_time`` (the alarm
    deadline the delivery fired for, when one did), ``yield_at`` (the agent's yield point: no
    attempt or wave is admitted after it), ``dispatch_end`` (no wave is admitted whose
    allowance would end after it) and ``event_deadline`` (the pass fails past it). A wave's
    own allowance end is its handler's ``LaneContext.deadline``.
    """

    ref: Host | int  # the host as given (an id is read by the begin transaction)
    runtime: Runtime
    started_at: datetime
    slot_time: datetime | None = None
    guard: bool = False  # an alarm delivery: the early-fire guard applies
    host: Host = field(init=False)  # set by begin
    yield_at: datetime = field(init=False)
    dispatch_end: datetime = field(init=False)
    event_deadline: datetime = field(init=False)

    # What the begin transaction found, under the host's locks.
    lease: Lease | Busy | Stale | None = None
    generation: int | None = None  # the generation observed (None: begin read nothing)
    actionable: bool = False  # begin charged the native lane
    nonterminal: int = 0
    active_at_start: int = 0
    source_revision: int | None = None
    stalls: int = 0
    rows: list[Lane] = field(default_factory=list)
    producing: frozenset[str] = frozenset()
    last_recovered_thread: str | None = None  # the old-work recovery cursor
    last_after_native_lane: str | None = None  # the after-native rotation cursor
    # Note [Nothing or one wave to run]: the one wave begin charged (and when), or the pass
    # begin finished itself (its slot decision, and whether a parked lane waits for its notice).
    wave: tuple[LaneSpec, Lane, datetime] | None = None
    finished: bool = False
    alarm: str = ""
    parked: bool = False

    # What the pass charged and saw of the lanes, for ``rearm_failure`` (shared by its wave
    # threads, hence ``lock``), and whether a failure can only be the native step's.
    native_only: bool = False
    seen: dict[str, Lane] = field(default_factory=dict)
    charged: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # The native step.
    executor: Executor | None = None
    recovery: NativeRecovery = field(default_factory=NativeRecovery)
    native_runs: bool = False  # the native step may run (no publication wave pending)
    settled: int = 0
    progressed: bool = False
    next_at: datetime | None = None  # the native lane's next time, as the step left it

    def __post_init__(self) -> None:
        self.yield_at = self.started_at + conf.yield_after()
        self.dispatch_end = self.started_at + conf.dispatch_until()
        self.event_deadline = self.started_at + conf.event_timeout()

    @property
    def lateness_ms(self) -> int | None:
        """How long after its slot time the pass began (None: not an alarm delivery)."""
        if self.slot_time is None:
            return None
        return int((self.started_at - self.slot_time) / timedelta(milliseconds=1))

    @property
    def slots(self) -> int:
        """How many heads one native step attempts at once."""
        return 1 if self.host.single_thread else 2

    def saw(self, rows: list[Lane]) -> None:
        """Remember the lanes as begin read them (a claim's image is kept)."""
        with self.lock:
            for row in rows:
                self.seen.setdefault(row.lane, row)

    def claimed(self, lane: Lane) -> None:
        """Remember a committed claim (``rearm_failure`` must not charge the lane twice)."""
        with self.lock:
            self.charged[lane.lane] = lane.revision
            self.seen[lane.lane] = lane
