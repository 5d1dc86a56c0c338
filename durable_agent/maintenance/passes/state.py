"""The pass: one object per maintenance pass of one host, built by its begin.

``Pass`` holds everything the phases of one pass share: the host and runtime, the lease,
the window (its times, one name each), what the begin transaction read under the host's
locks, what the pass charged and saw of the lanes (``rearm_failure`` must not charge a lane
twice, and a wave acknowledges only the revision it saw), the native step's recovery and what
its attempts settled, and the executor its waves and attempts run on. The phases are functions
of it: ``begin`` (``passes/run.py``), the native step (``passes/native.py``), the waves
(``passes/waves.py``) and the finish (``passes/finish.py``).

The pass lease the pass holds (``take``, ``Lease``, ``Busy``, ``Stale``): one pass per host at a
time, across processes (docs/pass.md). Taking the lease arms the slot no later than the lease's
expiry, in the same short transaction: a worker that dies mid-pass is retried within the lease
TTL, and no path leaves a dirty host with a disarmed slot. A busy delivery likewise leaves the
slot armed no later than the running pass's expiry. The heartbeat renews a long pass's lease
(from a thread started at its first renewal).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from durable_agent import clock, conf
from durable_agent.maintenance.passes.lane_registry import LaneSpec
from durable_agent.maintenance.passes.pool import Executor
from durable_agent.maintenance.passes.recovery import NativeRecovery
from durable_agent.maintenance.store.transactions import AlarmTx
from durable_agent.maintenance.types import Lane
from durable_agent.models import Host, MaintenanceState
from durable_agent.renewals import renewing
from durable_agent.runtime import Runtime

#: The lanes and producing lanes as the checkpoint's transaction left them (Note [What the
#: pass already knows after its agents] in ``passes/native.py``).
Known = tuple[list[Lane], frozenset[str]]


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
    prompt: bool = False  # a prompt start (Note [Prompt start] in ``passes/run.py``)
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
    last_served_thread: str | None = None  # the round-robin cursor (the checkpoint writes it)
    last_after_native_lane: str | None = None  # the after-native rotation cursor
    # Note [Nothing or one wave to run]: the one wave begin charged (and when), or the pass
    # begin finished itself (its slot decision, and whether a parked lane waits for its notice);
    # the native step's checkpoint may finish it too (Note [The checkpoint finishes a pass that
    # has nothing after it] in ``passes/native.py``).
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
    # Note [What the pass already knows after its agents]: no binding wait exists (the first
    # observation found none and the pass recorded none), and the lanes and producing lanes
    # as the checkpoint's transaction left them.
    no_binding_waits: bool = False
    after_checkpoint: Known | None = None

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


logger = logging.getLogger("durable_agent.maintenance")


@dataclass(frozen=True)
class Lease:
    host_id: int
    owner: str
    expires_at: datetime


@dataclass(frozen=True)
class Busy:
    host_id: int
    owner: str
    expires_at: datetime


@dataclass(frozen=True)
class Stale:
    """An alarm delivery with nothing to do: the slot moved later, or nothing is due."""

    host_id: int
    reason: str


def take(
    tx: AlarmTx, now: datetime, *, fired_for: datetime | None = None, prompt: bool = False
) -> Lease | Busy | Stale:
    """Take the host's pass lease inside an alarm transaction, or say why not.

    Arms the slot no later than the lease's expiry. With ``fired_for`` (the deadline an alarm
    delivery carries) this is also the early-fire guard: when the slot now holds a later time,
    or nothing is due, the delivery changes nothing but making sure the slot holds the
    earliest lane deadline. A ``prompt`` start (Note [Prompt start] in ``passes/run.py``)
    ignores the slot, which holds the backstop, and writes nothing unless it takes the lease.
    """
    state, checkpoint = tx.state, tx.checkpoint
    host_id = tx.host_id
    if fired_for is not None or prompt:
        earliest = tx.queue.next()
        if not prompt and checkpoint.current is not None and checkpoint.current > now:
            return Stale(host_id, "the slot holds a later time")
        due = (
            state.dirty > state.processed
            or state.has_recovery_events
            or (earliest is not None and earliest <= now)
        )
        if not due:
            if not prompt:
                # This delivery consumed the slot: it now holds the earliest future deadline.
                tx.arm_at_earliest(now)
            return Stale(host_id, "nothing is due")
    held = state.pass_lease_expires_at
    if state.pass_lease_owner and held is not None and held > now:
        if prompt:  # the slot keeps the backstop
            return Busy(host_id, state.pass_lease_owner, held)
        # This delivery consumed a due slot: wake again when the running lease expires (the
        # running pass re-arms the slot itself when it finishes).
        if checkpoint.current is None or checkpoint.current <= now:
            checkpoint.at(held)
        else:
            checkpoint.earlier(held)
        return Busy(host_id, state.pass_lease_owner, held)
    owner = uuid.uuid4().hex
    expires = now + conf.pass_lease_ttl()
    state.pass_lease_owner = owner
    state.pass_lease_expires_at = expires
    # This pass sees all that was committed before it: a queued delivery is spent, and the
    # slot becomes the backstop at the lease's expiry (Note [A queued delivery holds the slot]).
    checkpoint.spend()
    checkpoint.earlier(expires)
    return Lease(host_id, owner, expires)


def release_in(state: MaintenanceState, lease: Lease) -> None:
    """Give the lease back inside an alarm transaction (only if it is still ours)."""
    if state.pass_lease_owner == lease.owner:
        state.pass_lease_owner = None
        state.pass_lease_expires_at = None


def release(lease: Lease) -> None:
    """Give the lease back (only if it is still ours)."""
    MaintenanceState.objects.filter(host_id=lease.host_id, pass_lease_owner=lease.owner).update(
        pass_lease_owner=None, pass_lease_expires_at=None
    )


def renew(lease: Lease) -> bool:
    """Push the lease's expiry one TTL ahead; False when it is no longer ours."""
    updated = MaintenanceState.objects.filter(
        host_id=lease.host_id, pass_lease_owner=lease.owner
    ).update(pass_lease_expires_at=clock.now() + conf.pass_lease_ttl())
    return updated == 1


@contextmanager
def heartbeat(lease: Lease) -> Iterator[None]:
    """Renew the lease every third of its TTL while the block runs (a thread starts only at the
    first renewal: Note [A renewal thread starts only when it is due] in
    ``durable_agent/renewals.py``)."""

    def beat() -> bool:
        try:
            if renew(lease):
                return True
            logger.warning("pass lease of host %s was lost", lease.host_id)
        except Exception:
            logger.exception("pass lease heartbeat of host %s failed", lease.host_id)
        return False

    interval = conf.pass_lease_ttl().total_seconds() / 3
    with renewing(f"da-lease-{lease.host_id}", interval, beat):
        yield
