"""What the maintenance pass needs from a runtime (docs/pass.md#the-runtime-protocol).

The pass talks to the runtime only through :class:`Runtime`. Identifiers of threads and
submissions are the runtime's own strings. The ``RUNTIME`` setting selects the implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from durable_agent.models import Host

SubmissionState = Literal[
    "admitted", "ready", "running", "suspended", "unknown", "joined", "settled"
]
Disposition = Literal["repaired", "unknown", "unchanged"]


@dataclass(frozen=True)
class WorkItem:
    """One nonterminal submission, as ``scan_nonterminal`` returns it (FIFO per thread).

    ``holds_thread``: an ``unknown`` submission that keeps the later submissions of its thread
    waiting (strict ordering). By default an ``unknown`` submission that recovery reported as
    a stable wait is skipped, and the next one becomes the thread's head.

    ``not_before``: a ``ready`` submission that may not start before this time (delayed work,
    or a retry's next try). The pass does not attempt it before ``START_LEAD`` ahead of it,
    keeps the host's native work due at that time, and the submissions behind it on its
    thread wait with it (Note [Start delayed work at its time]).

    ``recoverable``: whether the runtime's recovery (``run_recovery``, an abort intent) could
    change this submission now. A runtime that knows it cannot (the reference runtime: a
    ``ready`` submission without an abort intent) says False, and the pass neither reads the
    abort intent of such a head nor sweeps a thread whose submissions are all such before
    attempting it; a scan whose submissions are all not recoverable says the host owns no
    recoverable work, and the pass does not call ``discover_work_threads`` after it (Note [A
    thread with nothing to recover is not swept] in
    ``durable_agent/maintenance/passes/native.py``). The default, True, keeps all three.
    """

    thread: str
    submission: str
    state: str
    holds_thread: bool = False
    not_before: datetime | None = None
    recoverable: bool = True

    def delayed(self, now: datetime) -> bool:
        """A ``ready`` item whose ``not_before`` is more than ``START_LEAD`` ahead of ``now``."""
        return (
            self.state == "ready"
            and self.not_before is not None
            and self.not_before - START_LEAD > now
        )

    def pass_due(self) -> datetime | None:
        """When a pass should begin to start this item at its ``not_before``."""
        return None if self.not_before is None else self.not_before - START_LEAD


#: Note [Start delayed work at its time]
#:     A pass does work of its own before a head's agent starts (its begin, the observation,
#:     the claim): some 15 to 25 ms on an idle machine. Begun at ``not_before`` it would start
#:     the agent that much late. So the pass treats a delayed head as due ``START_LEAD``
#:     before its ``not_before``, and the runtime holds the attempt until ``not_before``
#:     (``process_thread_head`` sleeps at most the lead; a head further ahead is not
#:     attempted). The agent starts at its time, never sooner; the worker is held at most the
#:     lead. ``durable_agent/broker.py`` does the same for the alarm's own firing (Note [Fire
#:     ahead, run at the deadline]).
START_LEAD = timedelta(milliseconds=25)


@dataclass(frozen=True)
class DiscoveryPage:
    """Threads that own recoverable work, after a cursor; ``after`` is set when more remain."""

    threads: tuple[str, ...] = ()
    after: str | None = None


@dataclass(frozen=True)
class RecoveryReport:
    """A recovery decision about one submission.

    ``decision`` names what recovery decided (for example ``"ApplyInput"``, ``"SettleAborted"``,
    ``"MarkUnknown"``); ``disposition`` says whether it repaired anything.
    """

    thread: str
    submission: str
    decision: str
    disposition: Disposition = "unchanged"


@dataclass(frozen=True)
class WorkReport:
    """A recovery outcome about a thread's own work (not tied to one submission)."""

    thread: str
    disposition: Disposition = "unchanged"
    retry_at: datetime | None = None


@dataclass(frozen=True)
class Blocked:
    """A thread whose recovery failed; ``failure`` never contains payload bytes."""

    thread: str
    failure: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RecoverySweep:
    """One page of recovery of one thread; ``cursor`` is set when more pages remain."""

    reports: tuple[RecoveryReport, ...] = ()
    work_reports: tuple[WorkReport, ...] | None = None
    blocked: tuple[Blocked, ...] = ()
    cursor: str | None = None


@dataclass(frozen=True)
class Settlement:
    """What one attempt settled."""

    thread: str
    submission: str
    outcome: str


@runtime_checkable
class Runtime(Protocol):
    """The runtime protocol. Every method may be called from a worker thread.

    One optional class attribute, read with a default (``discovers_scanned_only``):
    ``discovery_within_scan = True`` says that every thread ``discover_work_threads`` could
    return owns a submission ``scan_nonterminal`` returns (the reference runtime: discovery
    finds expired leases and abort intents, both on nonterminal submissions). The pass then
    skips discovery after an empty scan. Without it an empty scan still asks discovery, as
    upstream does.

    One optional method (``scan_with_generation``): ``scan_nonterminal_with_generation(host)
    -> tuple[list[WorkItem], int] | None``, the scan and the host's generation
    (``MaintenanceState.dirty``) read from one snapshot, so that every submission committed at
    or below that generation is in the scan and none after it; None when the host has no
    state row. The checkpoint's observation then reads both at once (Note [The checkpoint's
    scan reads its generation] in ``durable_agent/maintenance/passes/native.py``); without it
    the pass reads the generation first, then scans.
    """

    def binding_registry_key(self) -> str:
        """A stable, order-insensitive fingerprint of every registered binding."""
        ...

    def scan_nonterminal(self, host: Host) -> list[WorkItem]:
        """Every nonterminal submission of the host, FIFO per thread (control state only)."""
        ...

    def discover_work_threads(self, host: Host, after: str | None, limit: int) -> DiscoveryPage:
        """Up to ``limit`` threads owning recoverable work, ordered by id, after ``after``."""
        ...

    def run_recovery(self, host: Host, thread: str, cursor: str | None) -> RecoverySweep:
        """Recover one page of ``thread`` (expired leases, unknown outcomes...)."""
        ...

    def process_thread_head(
        self, host: Host, thread: str, yield_after: datetime
    ) -> Settlement | None:
        """Claim the head of ``thread``, run it and settle it, or return None.

        The head is the thread's first nonterminal submission, skipping ``unknown`` ones that
        do not hold the thread (``WorkItem.holds_thread``), as the pass does.

        Raises:
            BindingUnavailable: the head's agent binding is not registered here.
        """
        ...

    def read_abort_intent(self, host: Host, submission: str) -> object | None:
        """The accepted abort of a never-claimed head, or None."""
        ...


def discovers_scanned_only(runtime: Runtime) -> bool:
    """Whether ``runtime`` says its discovery finds only threads its scan returns (the optional
    ``discovery_within_scan`` attribute of :class:`Runtime`; default False)."""
    return getattr(runtime, "discovery_within_scan", False) is True


def scan_with_generation(runtime: Runtime, host: Host) -> tuple[list[WorkItem], int] | None:
    """The scan and the generation from one snapshot, when ``runtime`` has the optional
    ``scan_nonterminal_with_generation`` (see :class:`Runtime`); else None."""
    method = getattr(runtime, "scan_nonterminal_with_generation", None)
    if method is None:
        return None
    found: tuple[list[WorkItem], int] | None = method(host)
    return found


def stable_external_wait(item: WorkItem, reports: dict[str, RecoveryReport]) -> bool:
    """Is the row dormant until an external mutation (approval, unknown resolution...)?"""
    report = reports.get(item.submission)
    if report is not None and report.decision == "SettleAborted":
        return False
    if item.state in ("suspended", "joined"):
        return True
    if item.state == "unknown":
        return report is not None and report.disposition == "unknown"
    if item.state == "admitted":
        return report is not None and report.decision == "AwaitParentEstablishment"
    return False
