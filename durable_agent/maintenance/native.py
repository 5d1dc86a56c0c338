"""The native step of a pass: scan, discover, recover, select, attempt, checkpoint (6.4, 6.5).

Note [Acknowledge only the observed generation]
    A pass records the generation it observed when it began. Its checkpoint acknowledges
    (``processed := generation``) only that one, and only when nothing autonomous remains and
    no mutation overlapped it. A producer that committed during the pass advanced ``dirty``
    past the observed generation, so the host stays dirty and its alarm armed.

Note [Stable waits are not swept]
    Upstream sweeps every head that is not eligible, stable waits included. A thread whose head
    waits on an external mutation (approval, unknown resolution, a parked binding) has nothing
    recovery can do until that mutation arrives, and the mutation advances the generation
    itself; sweeping it again every pass would keep a host with many waits autonomous forever.
    So the old-work backlog holds the heads and the discovered work owners that are not
    eligible, minus every thread whose head waits.

Note [An unknown head does not hold up its thread]
    As upstream: an ``unknown`` submission that recovery reported as a stable wait is skipped
    when the pass picks each thread's head, so the submission behind it becomes the head and
    runs. Recovery reports it in the pass's first sweep of the thread (old-work recovery), so
    the pass selects a second time after that sweep when nothing was dispatched yet (Note
    [Select again after recovery]). A ``WorkItem`` with ``holds_thread`` (an agent registered
    with ``strict_order=True``) is not skipped: its thread waits with it (next Note).

Note [Followers behind a stable wait]
    A ``ready`` submission queued behind a head that waits on an external mutation (approval,
    a held unknown resolution, a parked binding) cannot run before its head: it is dormant
    too, so a suspended thread keeps no alarm however much input is queued behind it.

Note [Select again after recovery]
    Upstream's scheduling loop advances again once old-work recovery finished, dispatching
    when no attempt has settled yet: the recovery reports can release a thread (an unknown
    head becomes a stable wait, an expired lease becomes ``ready``). The port keeps that one
    refill: when the first selection dispatched nothing and the backlog was swept, the pass
    observes and selects once more before its checkpoint.

Size: the native step (NativeStep) follows the phases of one pass; splitting it is pending.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from durable_agent import clock, conf
from durable_agent.errors import BindingUnavailable
from durable_agent.maintenance import backoff, failpoints, gate
from durable_agent.maintenance.alarm import Checkpoint, clear_retry
from durable_agent.maintenance.due_queue import DueQueue
from durable_agent.maintenance.recovery import (
    READ_ABORT_INTENT,
    NativeRecovery,
    blocked_failure,
    load_recovery_faults,
    record_recovery_faults,
    recover_thread,
)
from durable_agent.maintenance.transactions import run_alarm_transaction
from durable_agent.maintenance.waves import Executor, bounded_call
from durable_agent.models import BindingRetry, Host, MaintenanceState, MutationTicket
from durable_agent.observability import log_extra
from durable_agent.runtime import RecoverySweep, Runtime, WorkItem, stable_external_wait

logger = logging.getLogger("durable_agent.maintenance")
DISCOVERY_LIMIT = 32


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
class _View:
    """One control-state observation of the ledger."""

    scanned_generation: int
    current: list[WorkItem]
    owners: tuple[str, ...]
    heads: dict[str, WorkItem]
    eligible: list[str]
    waits: list[BindingRetry]
    waiting: Callable[[WorkItem], bool]
    last_recovered: str | None
    last_served: str | None


@dataclass
class NativeStep:
    """Runs the native step of one pass for one host.

    Size: the phases of one native pass share its state; a split by phase is pending.
    """

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

    def run(self) -> NativeResult:
        if not self.started.actionable:
            return NativeResult("caught-up", self.started.nonterminal, None)
        view = self._observe()
        selected, backlog = self._select(view)
        self._dispatch(view, selected, backlog)
        if backlog and not selected and clock.now() < self.yield_after:
            view = self._observe()  # Note [Select again after recovery]
            selected, _ = self._select(view)
            self._dispatch(view, selected, [])
        return self._checkpoint()

    def _dispatch(self, view: _View, selected: list[str], backlog: list[str]) -> None:
        """Attempt the selected heads while the backlog is recovered; join them all."""
        futures: list[Future[int]] = []
        if clock.now() < self.yield_after:
            futures = [self._submit_attempt(view.heads[t], view.waits) for t in selected]
        failure: BaseException | None = None
        try:
            for thread in backlog:
                self._recover_backlog_thread(thread)
        except BaseException as exc:  # still join the attempts before failing the pass
            failure = exc
        for future in futures:
            try:
                value = future.result()
            except BaseException as exc:
                failure = failure or exc
                continue
            self.settled += value
            self.progressed |= value > 0
        if failure is not None:
            raise failure

    def _submit_attempt(self, head: WorkItem, waits: list[BindingRetry]) -> Future[int]:
        return self.executor.submit(lambda: self._attempt(head, waits))

    # -- observation -----------------------------------------------------------------------

    def _observe(self) -> _View:
        host, runtime, recovery = self.host, self.runtime, self.recovery
        state = MaintenanceState.objects.get(host_id=host.pk)
        with gate.native_source():
            current = list(runtime.scan_nonterminal(host))
            owners = runtime.discover_work_threads(
                host, state.last_recovered_thread, DISCOVERY_LIMIT
            )
            if not owners.threads and state.last_recovered_thread is not None:
                owners = runtime.discover_work_threads(host, None, DISCOVERY_LIMIT)
        recovery.discovery_pending |= owners.after is not None
        selection_time = clock.now()
        ids_by_thread: dict[str, list[str]] = {}
        for item in current:
            ids_by_thread.setdefault(item.thread, []).append(item.submission)
        for thread in owners.threads:
            ids_by_thread.setdefault(thread, [])
        load_recovery_faults(host, ids_by_thread, recovery, selection_time)
        waits = list(BindingRetry.objects.filter(host_id=host.pk))
        parked = {w.submission for w in waits}
        reports, faults = recovery.reports, recovery.faults

        def waiting(item: WorkItem) -> bool:
            return (
                item.thread not in recovery.pending
                and item.thread not in faults
                and (item.submission in parked or stable_external_wait(item, reports))
            )

        heads: dict[str, WorkItem] = {}
        for item in current:  # Note [An unknown head does not hold up its thread]
            if skipped(item, waiting):
                continue
            heads.setdefault(item.thread, item)
        stopping = self._stopping(heads, current)
        eligible = sorted(
            thread
            for thread, head in heads.items()
            if thread not in recovery.pending
            and thread not in stopping
            and thread not in faults
            and not waiting(head)
            and (head.state == "ready" or head.submission in reports)
        )
        waits = [
            w for w in waits if w.thread in heads and heads[w.thread].submission == w.submission
        ]
        return _View(
            scanned_generation=state.dirty,
            current=current,
            owners=owners.threads,
            heads=heads,
            eligible=eligible,
            waits=waits,
            waiting=waiting,
            last_recovered=state.last_recovered_thread,
            last_served=state.last_served_thread,
        )

    def _stopping(self, heads: dict[str, WorkItem], current: list[WorkItem]) -> set[str]:
        """Ready heads with an accepted abort: recovery settles them, no attempt runs."""
        stopping: set[str] = set()
        for head in heads.values():
            if (
                head.state != "ready"
                or head.thread in self.recovery.pending
                or head.thread in self.recovery.faults
            ):
                continue
            try:  # Note [A hung runtime call is abandoned]
                intent = bounded_call(
                    READ_ABORT_INTENT,
                    functools.partial(self.runtime.read_abort_intent, self.host, head.submission),
                )
            except Exception as exc:
                sweep = RecoverySweep(
                    blocked=(blocked_failure(head.thread, exc, READ_ABORT_INTENT),)
                )
                faults = record_recovery_faults(
                    self.host, self.runtime, sweep, self.recovery, current=current
                )
                self.recovery.faults.update(faults)
                self.recovery.recovered += 1
                continue
            if intent is not None:
                stopping.add(head.thread)
        return stopping

    # -- selection -------------------------------------------------------------------------

    def _select(self, view: _View) -> tuple[list[str], list[str]]:
        recovery = self.recovery
        waiting_threads = {w.thread for w in view.waits}
        runnable = [t for t in view.eligible if t not in waiting_threads]
        selection_time = clock.now()

        failpoints.hit("maintenance:select:before")

        def fn(
            state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint
        ) -> tuple[list[str], list[str], bool]:
            last = state.last_served_thread
            pivot = next((i for i, t in enumerate(runnable) if last is None or t > last), 0)
            selected = (runnable[pivot:] + runnable[:pivot])[: self.slots]
            if selected:
                state.last_served_thread = selected[-1]
            if recovery.started:
                return selected, [], False
            backlog = [
                t
                for t in dict.fromkeys([*view.heads, *view.owners])
                if t not in view.eligible
                and not (t in view.heads and view.waiting(view.heads[t]))
                and (t not in recovery.faults or recovery.faults[t].retry_at <= selection_time)
            ]
            cursor = state.last_recovered_thread
            after = [t for t in backlog if cursor is None or t > cursor]
            before = [t for t in backlog if cursor is not None and t <= cursor]
            return selected, (after + before)[:DISCOVERY_LIMIT], len(backlog) > DISCOVERY_LIMIT

        selected, backlog, overflow = run_alarm_transaction(
            self.host.pk, "select maintenance work", fn
        )
        failpoints.hit("maintenance:select:after")
        if not recovery.started:
            recovery.started = True
            recovery.needs_checkpoint = bool(backlog)
            recovery.discovery_pending |= overflow
            recovery.pending |= set(backlog)
        return selected, backlog

    def _recover_backlog_thread(self, thread: str) -> None:
        """Old-work recovery: the cursor is persisted before the work (a crash moves on)."""

        def fn(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> None:
            state.last_recovered_thread = thread

        failpoints.hit("maintenance:select:before")
        run_alarm_transaction(self.host, "advance recovery cursor", fn)
        failpoints.hit("maintenance:select:after")
        recover_thread(self.host, self.runtime, thread, self.recovery)
        with self.recovery.lock:
            self.recovery.pending.discard(thread)

    def _attempt(self, head: WorkItem, previous_waits: list[BindingRetry]) -> int:
        """Recover the thread, then run its head once (docs/pass.md, step 2)."""
        recover_thread(self.host, self.runtime, head.thread, self.recovery)
        binding_failure: BindingUnavailable | None = None
        settlement = None
        if head.thread not in self.recovery.faults:
            try:
                with gate.native_source():
                    settlement = self.runtime.process_thread_head(
                        self.host, head.thread, self.yield_after
                    )
            except BindingUnavailable as exc:
                binding_failure = exc
        previous = next((w for w in previous_waits if w.submission == head.submission), None)
        if binding_failure is not None and previous is None:
            logger.error(
                "Thread parked until its agent binding registry changes; "
                "original work remains pending",
                extra=log_extra(
                    self.host,
                    thread_key=head.thread,
                    submission_id=head.submission,
                    error=str(binding_failure),
                    action="binding_wait",
                ),
            )
        if binding_failure is not None or previous is not None:
            self._record_binding_wait(head, previous, binding_failure is not None)
        return 1 if settlement is not None else 0

    def _record_binding_wait(
        self, head: WorkItem, previous: BindingRetry | None, parked: bool
    ) -> None:
        now = clock.now()
        key = self.runtime.binding_registry_key()

        def fn(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> None:
            BindingRetry.objects.filter(host_id=state.host_id, submission=head.submission).delete()
            if parked:
                BindingRetry.objects.create(
                    host_id=state.host_id,
                    thread=head.thread,
                    submission=head.submission,
                    attempts=min(
                        backoff.MAX_RETRY_STALLS, (previous.attempts if previous else 0) + 1
                    ),
                    reported_at=previous.reported_at if previous else now,
                    registry_key=key,
                )

        failpoints.hit("maintenance:binding-retry:before")
        run_alarm_transaction(self.host, "record submission binding wait", fn)
        failpoints.hit("maintenance:binding-retry:after")

    # -- checkpoint ------------------------------------------------------------------------

    def _checkpoint(self) -> NativeResult:
        """Acknowledge what was observed, or back off; never writes the slot itself."""
        view = self._observe()
        recovery, started = self.recovery, self.started
        remaining = view.current
        reports = recovery.reports
        first_seen: dict[str, bool] = {}

        def is_autonomous(item: WorkItem) -> bool:
            if skipped(item, view.waiting):
                return False  # Note [An unknown head does not hold up its thread]
            waits = view.waiting(item)
            head_waiting = first_seen.get(item.thread)
            if head_waiting is None:
                first_seen[item.thread] = waits
            if head_waiting is True and item.state == "ready":
                return False  # Note [Followers behind a stable wait]
            return not waits

        autonomous = (
            bool(recovery.pending)
            or recovery.discovery_pending
            or bool(recovery.faults)
            or recovery.retry_at is not None
            or any([is_autonomous(item) for item in remaining])
        )
        del reports
        progressed = self.progressed or recovery.repaired
        now = clock.now()
        jitter = clock.random()
        if autonomous:
            ordinary = (
                conf.backoff_base_ms()
                if progressed
                else backoff.backoff_delay_ms(started.stalls, jitter)
            )
        else:
            ordinary = 0
        waiting_threads = {w.thread for w in view.waits}
        next_eligible = [f.retry_at for f in recovery.faults.values()]
        next_eligible += [now for t in view.eligible if t not in waiting_threads]
        if recovery.retry_at is not None:
            next_eligible.append(recovery.retry_at)
        retry_ms = (
            max(0, int((min(next_eligible) - now) / timedelta(milliseconds=1)))
            if next_eligible
            else 0
        )
        delay = timedelta(milliseconds=max(ordinary, retry_ms))
        remaining_ids = {item.submission for item in remaining}

        def fn(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> datetime | None:
            active = _live_tickets(state.host_id, now)
            overlap = started.active_at_start > 0 or active > 0
            generation = (
                view.scanned_generation
                if not remaining
                and not view.owners
                and not overlap
                and state.dirty == view.scanned_generation
                else started.generation
            )
            if not (autonomous or overlap):
                state.processed = max(state.processed, generation)
            can_backoff = not overlap and state.dirty == started.generation
            clear_retry(state)
            state.nonterminal = len(remaining)
            BindingRetry.objects.filter(host_id=state.host_id).exclude(
                submission__in=remaining_ids
            ).delete()
            if autonomous and not progressed and can_backoff:
                state.retry_generation = started.generation
                state.retry_not_before = now + delay
                state.retry_native_only = True
                state.retry_stalls = min(backoff.MAX_RETRY_STALLS, started.stalls + 1)
            if autonomous:
                due: datetime | None = now + (delay if can_backoff else _min_delay())
            elif overlap or state.dirty > state.processed:
                due = now + _min_delay()
            else:
                due = None
            queue.checkpoint_native(due)
            return due

        failpoints.hit("maintenance:checkpoint:before")
        next_at = run_alarm_transaction(self.host, "checkpoint maintenance generation", fn)
        failpoints.hit("maintenance:checkpoint:after")
        return NativeResult("actionable", len(remaining), next_at, self.settled)


def skipped(item: WorkItem, waiting: Callable[[WorkItem], bool]) -> bool:
    """An ``unknown`` row that waits and does not hold its thread is no thread's head."""
    return item.state == "unknown" and not item.holds_thread and waiting(item)


def _min_delay() -> timedelta:
    return conf.minimum_alarm_delay()


def _live_tickets(host_id: int, now: datetime) -> int:
    return MutationTicket.objects.filter(host_id=host_id).live(now=now).count()
