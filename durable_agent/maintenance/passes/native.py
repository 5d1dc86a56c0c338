"""The native step of a pass: scan, discover, recover, select, attempt, checkpoint (6.4, 6.5).

``run_native`` runs the phases in order over the pass (``state.py``), and this module holds
them in that order: observe the ledger (``observe``), select the heads and the old-work backlog
(``select``), attempt the heads while the backlog is recovered (``dispatch``), then acknowledge
or back off (``checkpoint``).

Size: the native step, phase after phase, is read in one module, top to bottom.

Note [Select again after recovery]
    Upstream's scheduling loop advances again once old-work recovery finished, dispatching
    when no attempt has settled yet: the recovery reports can release a thread (an unknown
    head becomes a stable wait, an expired lease becomes ``ready``). The port keeps that one
    refill: when the first selection dispatched nothing and the backlog was swept, the pass
    observes and selects once more before its checkpoint.

Note [Wait for a head due within the minimum delay]
    A delayed head (Note [Delayed heads]) that comes due less than the minimum alarm delay
    after the attempts of this pass would wait for a slot armed no sooner than that delay: up
    to 50 ms late. So the pass, which holds the lease already, sleeps until it is due (at most
    the minimum delay) and then observes and selects once more, as after recovery. A head
    due later is left to the slot.

Observe: scan the ledger, discover work owners, pick each thread's head.

Note [An unknown head does not hold up its thread]
    As upstream: an ``unknown`` submission that recovery reported as a stable wait is skipped
    when the pass picks each thread's head, so the submission behind it becomes the head and
    runs. Recovery reports it in the pass's first sweep of the thread (old-work recovery), so
    the pass selects a second time after that sweep when nothing was dispatched yet (Note
    [Select again after recovery]). A ``WorkItem`` with ``holds_thread`` (an agent registered
    with ``strict_order=True``) is not skipped: its thread waits with it (Note [Followers
    behind a stable wait]).

Select: the heads to attempt, round-robin, and the old-work backlog.

Note [Stable waits are not swept]
    Upstream sweeps every head that is not eligible, stable waits included. A thread whose head
    waits on an external mutation (approval, unknown resolution, a parked binding) has nothing
    recovery can do until that mutation arrives, and the mutation advances the generation
    itself; sweeping it again every pass would keep a host with many waits autonomous forever.
    So the old-work backlog holds the heads and the discovered work owners that are not
    eligible, minus every thread whose head waits.

Dispatch: attempt the selected heads while the backlog is recovered, and
record the heads that wait on their agent binding.

Note [A thread with nothing to recover is not swept]
    Upstream sweeps a thread's recovery before every attempt on it, and reads the abort intent
    of every ``ready`` head. The runtime's scan says which submissions its recovery could
    change now (``WorkItem.recoverable``; the reference runtime: an expired lease, an abort
    intent, an unknown outcome, anything not ``ready``). A thread whose scanned submissions
    are all not recoverable has nothing a sweep would report, repair or block on: the pass
    attempts its head without the sweep (the work cursor, ``run_recovery``, the recovery
    status transaction), and reads no abort intent for such a head; when every scanned
    submission of the host is such, no thread owns recoverable work and the pass skips
    ``discover_work_threads`` too (an empty scan still asks it, unless the runtime says its
    discovery finds only threads its scan returns: ``Runtime``'s optional attribute
    ``discovery_within_scan``, which the reference runtime sets). The selection already
    excluded faulted and pending threads, so no fault is left to clear. What changes after
    the scan is a producer's mutation: an abort is settled or seen by the claim itself
    (``process_thread_head`` does not run a head with an abort intent), and it advances the
    generation, so the next pass sweeps. A runtime that does not say (the default, True)
    keeps upstream's sweep before every attempt.

Checkpoint: acknowledge what the pass observed, or back off.

Note [The checkpoint finishes a pass that has nothing after it]
    The general path ends with the finish's transaction (``passes/finish.py``): it gives the
    lease back and re-arms the slot at the earliest lane, or clears it. When nothing of the
    pass runs after its checkpoint (no concurrent wave ran beside the native step, no other
    lane is due, so neither the refill nor the after-native waves would admit one; the event
    deadline not past), the checkpoint's transaction makes that decision itself
    (``settle_alarm`` after its own), under the same locks, and writes the pass's record as
    the short paths do: one transaction, one commit of the record and five statements fewer
    for a pass that ran a fresh submission. What the separate finish would
    have seen besides, a producer committing between the two, is that producer's to arm: its
    commit arms the slot (and hints) once the lease is given back or at the lease's expiry, as
    for any producer that commits after a finish. The refill and the after-native waves of a
    pass so finished admit nothing (a lane that comes due meanwhile is the slot's), and its
    finish does nothing.

Note [What the pass already knows after its agents]
    After its attempts a pass observes again (the checkpoint's scan) and then looks for lanes
    its agents made due (Note [Deliver what the pass produced] in ``passes/waves.py``). Two
    of those reads are answered by what the pass already holds. Binding waits: only a pass
    creates them, under its lease (``record_binding_wait``), so when the first observation
    found none and no attempt recorded one, none exists and the next observation does not
    read them (an operator's repair or a registry change only deletes them). The lanes and
    the producing lanes: the checkpoint's transaction reads them under the host's locks, and
    when no concurrent wave ran beside the native step nothing of the pass writes a lane
    after it, so the refill takes them from it rather than reading them again. A producer
    that commits after the checkpoint is not the pass's product: its own commit arms the
    slot (and hints), and the finish re-reads everything under the locks.

Note [Acknowledge only the observed generation]
    A pass records the generation it observed when it began. Its checkpoint acknowledges
    (``processed := generation``) only that one, and only when nothing autonomous remains and
    no mutation overlapped it. A producer that committed during the pass advanced ``dirty``
    past the observed generation, so the host stays dirty and its alarm armed.

Note [Followers behind a stable wait]
    A ``ready`` submission queued behind a head that waits on an external mutation (approval,
    a held unknown resolution, a parked binding) cannot run before its head: it is dormant
    too, so a suspended thread keeps no alarm however much input is queued behind it.

Note [Delayed heads]
    A ``ready`` head whose ``not_before`` has not come (a delayed submission, a retry's next
    try) is not attempted, and the submissions behind it wait with it. Unlike a stable wait it
    needs no outside mutation, only time: the checkpoint keeps the generation unacknowledged
    and the native lane due at the earliest such ``not_before`` less the start lead (Note
    [Start delayed work at its time] in ``durable_agent/runtime/protocol.py``; never sooner,
    and without the no-progress backoff when nothing else is autonomous), so the pass at that
    time attempts it.
    Waiting for a time is not a stall: when nothing else is autonomous the checkpoint also
    drops the floor and stall count the native claim set (1 s, doubling), so a head due 100 ms
    from now starts at its time, not at the claim's floor.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from durable_agent import clock, conf, signals
from durable_agent.errors import BindingUnavailable
from durable_agent.maintenance import backoff, failpoints
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.maintenance.mutations import gate
from durable_agent.maintenance.passes.finish import report_of, settle_alarm, write_record
from durable_agent.maintenance.passes.pool import bounded_call
from durable_agent.maintenance.passes.recovery import (
    READ_ABORT_INTENT,
    blocked_failure,
    load_recovery_faults,
    record_recovery_faults,
    recover_thread,
)
from durable_agent.maintenance.passes.state import Known, Lease, Pass, release_in
from durable_agent.maintenance.store.transactions import AlarmTx, run_alarm_transaction
from durable_agent.maintenance.types import Lane
from durable_agent.models import BindingRetry, MaintenanceState, PassPhase
from durable_agent.observability import log_extra
from durable_agent.runtime import (
    DiscoveryPage,
    RecoverySweep,
    WorkItem,
    discovers_scanned_only,
    scan_with_generation,
    stable_external_wait,
)


def run_native(p: Pass) -> None:
    """Run the native step of a pass whose begin charged the native lane."""
    view = observe(p)
    selected, backlog = select(p, view)
    dispatch(p, view, selected, backlog)
    soon = coming_due(view)
    if ((backlog and not selected) or soon is not None) and clock.now() < p.yield_at:
        if soon is not None:  # Note [Wait for a head due within the minimum delay]
            time.sleep(max(0.0, (soon - clock.now()).total_seconds()))
        view = observe(p)  # Note [Select again after recovery]
        selected, _ = select(p, view)
        dispatch(p, view, selected, [])
    checkpoint(p)


def coming_due(view: View) -> datetime | None:
    """The earliest time a delayed head becomes due, when that is within the minimum alarm
    delay (Note [Wait for a head due within the minimum delay]); else None."""
    now = clock.now()
    due = [
        at
        for head in view.heads.values()
        if head.delayed(view.selection_time)  # not attempted: delayed when selected
        and not view.waiting(head)
        and (at := head.pass_due()) is not None
        and at - now <= _min_delay()
    ]
    return min(due, default=None)


DISCOVERY_LIMIT = 32


@dataclass
class View:
    """One control-state observation of the ledger."""

    scanned_generation: int | None  # read for the checkpoint only
    current: list[WorkItem]
    owners: tuple[str, ...]
    heads: dict[str, WorkItem]
    eligible: list[str]
    waits: list[BindingRetry]
    waiting: Callable[[WorkItem], bool]
    selection_time: datetime
    parked_any: bool  # the host had binding waits (of any thread) when observed


def observe(step: Pass, *, generation: bool = False) -> View:
    """Scan, discover and pick the heads; with ``generation``, also read the generation the
    scan answers for (the checkpoint acknowledges it).

    Note [The checkpoint's scan reads its generation]
        The checkpoint may acknowledge only a generation whose work its scan saw. A producer
        may have advanced the generation since begin (the rest of the state row is the
        pass's own, read by begin, kept by it), so the generation was read before the scan:
        a producer that commits between the two leaves work in the scan above the read
        generation, which is safe, never the reverse. A runtime that can read both in one
        statement (``scan_nonterminal_with_generation``, which the reference runtime has)
        gives them from one snapshot, exact and one statement fewer; any other runtime is
        read in that order.
    """
    host, runtime, recovery = step.host, step.runtime, step.recovery
    cursor = step.last_recovered_thread
    scanned_generation: int | None = None
    with gate.native_source():
        both = scan_with_generation(runtime, host) if generation else None
        if both is not None:  # Note [The checkpoint's scan reads its generation]
            current, scanned_generation = list(both[0]), both[1]
        else:
            if generation:
                scanned_generation = (
                    MaintenanceState.objects.filter(host_id=host.pk)
                    .values_list("dirty", flat=True)
                    .get()
                )
            current = list(runtime.scan_nonterminal(host))
        if (current or discovers_scanned_only(runtime)) and not any(
            item.recoverable for item in current
        ):
            owners = DiscoveryPage()  # Note [A thread with nothing to recover is not swept]
        else:
            owners = runtime.discover_work_threads(host, cursor, DISCOVERY_LIMIT)
            if not owners.threads and cursor is not None:
                owners = runtime.discover_work_threads(host, None, DISCOVERY_LIMIT)
    recovery.discovery_pending |= owners.after is not None
    selection_time = clock.now()
    ids_by_thread: dict[str, list[str]] = {}
    for item in current:
        ids_by_thread.setdefault(item.thread, []).append(item.submission)
    for thread in owners.threads:
        ids_by_thread.setdefault(thread, [])
    load_recovery_faults(host, ids_by_thread, recovery, selection_time)
    # Note [What the pass already knows after its agents]
    waits = [] if step.no_binding_waits else list(BindingRetry.objects.filter(host_id=host.pk))
    step.no_binding_waits = not waits
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
    stopping = stopping_threads(step, heads, current)
    eligible = sorted(
        thread
        for thread, head in heads.items()
        if thread not in recovery.pending
        and thread not in stopping
        and thread not in faults
        and not waiting(head)
        and not head.delayed(selection_time)  # Note [Delayed heads]
        and (head.state == "ready" or head.submission in reports)
    )
    waits = [w for w in waits if w.thread in heads and heads[w.thread].submission == w.submission]
    return View(
        scanned_generation=scanned_generation,
        current=current,
        owners=owners.threads,
        heads=heads,
        eligible=eligible,
        waits=waits,
        waiting=waiting,
        selection_time=selection_time,
        parked_any=bool(parked),
    )


def stopping_threads(step: Pass, heads: dict[str, WorkItem], current: list[WorkItem]) -> set[str]:
    """Ready heads with an accepted abort: recovery settles them, no attempt runs."""
    stopping: set[str] = set()
    for head in heads.values():
        if (
            head.state != "ready"
            or not head.recoverable  # no abort intent (Note [A thread with nothing ...])
            or head.thread in step.recovery.pending
            or head.thread in step.recovery.faults
        ):
            continue
        try:  # Note [A hung runtime call is abandoned]
            intent = bounded_call(
                READ_ABORT_INTENT,
                functools.partial(step.runtime.read_abort_intent, step.host, head.submission),
            )
        except Exception as exc:
            sweep = RecoverySweep(blocked=(blocked_failure(head.thread, exc, READ_ABORT_INTENT),))
            faults = record_recovery_faults(
                step.host, step.runtime, sweep, step.recovery, current=current
            )
            step.recovery.faults.update(faults)
            step.recovery.recovered += 1
            continue
        if intent is not None:
            stopping.add(head.thread)
    return stopping


def skipped(item: WorkItem, waiting: Callable[[WorkItem], bool]) -> bool:
    """An ``unknown`` row that waits and does not hold its thread is no thread's head."""
    return item.state == "unknown" and not item.holds_thread and waiting(item)


def select(step: Pass, view: View) -> tuple[list[str], list[str]]:
    """The heads to attempt, round-robin from ``last_served_thread``, and (the first time)
    the old-work backlog, after ``last_recovered_thread``.

    Note [The round-robin cursor is written by the checkpoint]
        Upstream writes ``lastServedThreadId`` in a transaction of its own before the
        attempts. Both cursors are the pass's own (only a pass writes them, under its lease,
        and begin read them under the host's locks), so the selection reads them from the
        pass and costs no transaction before the agent's first line; the checkpoint writes
        the round-robin cursor with the generation. A pass that fails before its checkpoint
        leaves the older cursor: the next pass serves the same rotation again, which only
        matters when more threads are runnable than the pass has slots.
    """
    recovery = step.recovery
    waiting_threads = {w.thread for w in view.waits}
    runnable = [t for t in view.eligible if t not in waiting_threads]
    selection_time = clock.now()

    failpoints.hit("maintenance:select:before")
    last = step.last_served_thread
    pivot = next((i for i, t in enumerate(runnable) if last is None or t > last), 0)
    selected = (runnable[pivot:] + runnable[:pivot])[: step.slots]
    if selected:
        step.last_served_thread = selected[-1]
    backlog: list[str] = []
    overflow = False
    if not recovery.started:
        owed = [
            t
            for t in dict.fromkeys([*view.heads, *view.owners])
            if t not in view.eligible
            and not (t in view.heads and view.waiting(view.heads[t]))
            and (t not in recovery.faults or recovery.faults[t].retry_at <= selection_time)
        ]
        cursor = step.last_recovered_thread
        after = [t for t in owed if cursor is None or t > cursor]
        before = [t for t in owed if cursor is not None and t <= cursor]
        backlog = (after + before)[:DISCOVERY_LIMIT]
        overflow = len(owed) > DISCOVERY_LIMIT
    failpoints.hit("maintenance:select:after")
    if not recovery.started:
        recovery.started = True
        recovery.needs_checkpoint = bool(backlog)
        recovery.discovery_pending |= overflow
        recovery.pending |= set(backlog)
    return selected, backlog


logger = logging.getLogger("durable_agent.maintenance")


def dispatch(step: Pass, view: View, selected: list[str], backlog: list[str]) -> None:
    """Attempt the selected heads while the backlog is recovered; join them all. A single
    attempt with no backlog beside it runs in the pass's own thread (nothing to overlap)."""
    futures: list[Future[int]] = []
    if clock.now() < step.yield_at:
        swept = {t for t in selected if any(i.recoverable for i in view.current if i.thread == t)}
        if len(selected) == 1 and not backlog:
            thread = selected[0]
            value = attempt(step, view.heads[thread], view.waits, sweep=thread in swept)
            step.settled += value
            step.progressed |= value > 0
            return
        futures = [
            submit_attempt(step, view.heads[t], view.waits, sweep=t in swept) for t in selected
        ]
    failure: BaseException | None = None
    try:
        for thread in backlog:
            recover_backlog_thread(step, thread)
    except BaseException as exc:  # still join the attempts before failing the pass
        failure = exc
    for future in futures:
        try:
            value = future.result()
        except BaseException as exc:
            failure = failure or exc
            continue
        step.settled += value
        step.progressed |= value > 0
    if failure is not None:
        raise failure


def submit_attempt(
    step: Pass, head: WorkItem, waits: list[BindingRetry], *, sweep: bool
) -> Future[int]:
    assert step.executor is not None
    return step.executor.submit(lambda: attempt(step, head, waits, sweep=sweep))


def recover_backlog_thread(step: Pass, thread: str) -> None:
    """Old-work recovery: the cursor is persisted before the work (a crash moves on)."""

    def fn(tx: AlarmTx) -> None:
        tx.state.last_recovered_thread = thread

    failpoints.hit("maintenance:select:before")
    run_alarm_transaction(step.host, "advance recovery cursor", fn)
    step.last_recovered_thread = thread
    failpoints.hit("maintenance:select:after")
    recover_thread(step.host, step.runtime, thread, step.recovery)
    with step.recovery.lock:
        step.recovery.pending.discard(thread)


def attempt(
    step: Pass, head: WorkItem, previous_waits: list[BindingRetry], *, sweep: bool = True
) -> int:
    """Recover the thread (unless it has nothing to recover: Note [A thread with nothing to
    recover is not swept]), then run its head once (docs/pass.md, step 2)."""
    if sweep:
        recover_thread(step.host, step.runtime, head.thread, step.recovery)
    binding_failure: BindingUnavailable | None = None
    settlement = None
    if head.thread not in step.recovery.faults:
        try:
            with gate.native_source():
                settlement = step.runtime.process_thread_head(step.host, head.thread, step.yield_at)
        except BindingUnavailable as exc:
            binding_failure = exc
    previous = next((w for w in previous_waits if w.submission == head.submission), None)
    if binding_failure is not None and previous is None:
        agent = getattr(binding_failure, "agent", "?")
        version = getattr(binding_failure, "version", "?")
        logger.error(
            "Thread parked until its agent binding registry changes; original work remains "
            "pending: agent %s@%s, thread %r, host %r, submission %s (deploy it, or restart the "
            "cluster if you changed its code: qcluster keeps the code it started with)",
            agent,
            version,
            head.thread,
            step.host.key,
            head.submission,
            extra=log_extra(
                step.host,
                thread_key=head.thread,
                submission_id=head.submission,
                error=str(binding_failure),
                action="binding_wait",
            ),
        )
        signals.needs_operator_on_commit(
            host_id=step.host.pk,
            submission_id=head.submission,
            thread=head.thread,
            agent=str(agent),
            version=str(version),
            reason="binding",
            log=False,
        )
    if binding_failure is not None or previous is not None:
        record_binding_wait(step, head, previous, binding_failure is not None)
    return 1 if settlement is not None else 0


def record_binding_wait(
    step: Pass, head: WorkItem, previous: BindingRetry | None, parked: bool
) -> None:
    now = clock.now()
    key = step.runtime.binding_registry_key()

    def fn(tx: AlarmTx) -> None:
        BindingRetry.objects.filter(host_id=tx.host_id, submission=head.submission).delete()
        if parked:
            BindingRetry.objects.create(
                host_id=tx.host_id,
                thread=head.thread,
                submission=head.submission,
                attempts=min(backoff.MAX_RETRY_STALLS, (previous.attempts if previous else 0) + 1),
                reported_at=previous.reported_at if previous else now,
                registry_key=key,
            )

    step.no_binding_waits = False  # observe reads them again
    failpoints.hit("maintenance:binding-retry:before")
    run_alarm_transaction(step.host, "record submission binding wait", fn)
    failpoints.hit("maintenance:binding-retry:after")


def checkpoint(step: Pass) -> None:
    """Acknowledge what was observed, or back off; never writes the slot itself. Leaves the
    native lane's next time in ``step.next_at`` and the work remaining in ``step.nonterminal``."""
    view = observe(step, generation=True)
    recovery, observed = step.recovery, step.generation
    assert observed is not None
    assert view.scanned_generation is not None
    remaining = view.current
    reports = recovery.reports
    first_seen: dict[str, bool] = {}
    timed: list[datetime] = []
    seen = clock.now()

    def is_autonomous(item: WorkItem) -> bool:
        if skipped(item, view.waiting):
            return False  # Note [An unknown head does not hold up its thread]
        waits = view.waiting(item)
        head_waiting = first_seen.get(item.thread)
        if head_waiting is None:
            delayed = item.delayed(seen)
            first_seen[item.thread] = waits or delayed
            due = item.pass_due()
            if delayed and not waits and due is not None:  # Note [Delayed heads]
                timed.append(due)
                return False
        if head_waiting is True and item.state == "ready":
            return False  # Note [Followers behind a stable wait]
        return not waits

    items_autonomous = any([is_autonomous(item) for item in remaining])
    untimed = (
        bool(recovery.pending)
        or recovery.discovery_pending
        or bool(recovery.faults)
        or recovery.retry_at is not None
        or items_autonomous
    )
    autonomous = untimed or bool(timed)
    del reports
    progressed = step.progressed or recovery.repaired
    now = clock.now()
    jitter = clock.random()
    if untimed:
        ordinary = (
            conf.backoff_base_ms() if progressed else backoff.backoff_delay_ms(step.stalls, jitter)
        )
    else:
        ordinary = 0
    waiting_threads = {w.thread for w in view.waits}
    next_eligible = [f.retry_at for f in recovery.faults.values()]
    next_eligible += [now for t in view.eligible if t not in waiting_threads]
    if recovery.retry_at is not None:
        next_eligible.append(recovery.retry_at)
    next_eligible += timed
    retry_ms = (
        max(0, math.ceil((min(next_eligible) - now) / timedelta(milliseconds=1)))
        if next_eligible
        else 0
    )
    delay = timedelta(milliseconds=max(ordinary, retry_ms))
    remaining_ids = {item.submission for item in remaining}

    scanned_generation = view.scanned_generation
    served = step.last_served_thread
    lease = step.lease

    def fn(tx: AlarmTx) -> tuple[datetime | None, Known, tuple[str, bool] | None]:
        state = tx.state
        active, producing = tx.producing_lanes(now)
        overlap = step.active_at_start > 0 or active > 0
        generation = (
            scanned_generation
            if not remaining
            and not view.owners
            and not overlap
            and state.dirty == scanned_generation
            else observed
        )
        state.last_served_thread = served  # Note [The round-robin cursor is written by ...]
        if not (autonomous or overlap):
            state.processed = max(state.processed, generation)
        can_backoff = not overlap and state.dirty == observed
        tx.clear_retry()
        state.nonterminal = len(remaining)
        if view.parked_any:  # only a pass, under its lease, creates them: none, none to drop
            BindingRetry.objects.filter(host_id=tx.host_id).exclude(
                submission__in=remaining_ids
            ).delete()
        if autonomous and not progressed and can_backoff:
            tx.back_off_native(observed, now + delay, step.stalls)
        if autonomous:
            due: datetime | None = now + (delay if can_backoff else _min_delay())
        elif overlap or state.dirty > state.processed:
            due = now + _min_delay()
        else:
            due = None
        tx.queue.checkpoint_native(due, on_time=bool(timed) and not untimed and not overlap)
        rows = tx.queue.read()
        finished = None
        if nothing_follows(step, rows, now) and isinstance(lease, Lease):
            # Note [The checkpoint finishes a pass that has nothing after it]
            release_in(state, lease)
            finished = settle_alarm(tx, observed, due, active, now)
            report = replace(
                report_of(step, PassPhase.ACTIONABLE.value),
                alarm=finished[0],
                nonterminal=len(remaining),
            )
            write_record(tx.host, step.started_at, report, deadline=step.slot_time)
            tx.commit_unflushed()  # Note [Begin does not wait for the flush]
        return due, (rows, producing), finished

    failpoints.hit("maintenance:checkpoint:before")
    step.next_at, step.after_checkpoint, finished = run_alarm_transaction(
        step.host, "checkpoint maintenance generation", fn
    )
    failpoints.hit("maintenance:checkpoint:after")
    step.nonterminal = len(remaining)
    if finished is not None:
        step.alarm, step.parked = finished
        step.finished = True


def nothing_follows(step: Pass, rows: list[Lane], now: datetime) -> bool:
    """Whether nothing of the pass runs after its checkpoint: no concurrent wave ran beside
    the native step and no lane but the native one is due (so the refill and the after-native
    waves would admit nothing), and the event deadline is not past."""
    return (
        step.native_only
        and now < step.event_deadline
        and not any(
            row.lane != NATIVE and row.due_at is not None and row.due_at <= now for row in rows
        )
    )


def _min_delay() -> timedelta:
    return conf.minimum_alarm_delay()
