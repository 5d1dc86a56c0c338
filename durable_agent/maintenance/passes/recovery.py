"""Native recovery: paged sweeps with work cursors, recovery faults and their events (docs/pass.md).

A thread whose recovery fails becomes a :class:`RecoveryFault` retried after 5 s, 10, 20, 40,
60, 60 ... s; it is never dispatched meanwhile. Every transition (created / changed / cleared,
one per recipient submission) is appended as a :class:`RecoveryEvent` and delivered in order,
at least once, by the recovery-events lane to the ``recovery_fault`` signal.

The recovery-events lane (``deliver_recovery_events``) delivers each recovery event, in order,
to ``recovery_fault``, at least once, and acknowledges each in an alarm transaction
(docs/pass.md). Work cursors (``read_cursor``, ``write_cursor``): where paged recovery of a
thread resumes after a crash.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from durable_agent import clock
from durable_agent.errors import InvalidInput, error_message, type_name
from durable_agent.maintenance import backoff, failpoints
from durable_agent.maintenance.lane_ids import RECOVERY_EVENTS
from durable_agent.maintenance.mutations import gate
from durable_agent.maintenance.passes.pool import RecoveryTimeout, bounded_call
from durable_agent.maintenance.store.transactions import AlarmTx, run_alarm_transaction
from durable_agent.maintenance.types import EPOCH, LaneContext
from durable_agent.models import MaintenanceState, RecoveryEvent, RecoveryFault, WorkCursor
from durable_agent.models.recovery import MAX_CURSOR_LENGTH
from durable_agent.observability import log_extra
from durable_agent.runtime import Blocked, RecoveryReport, RecoverySweep, Runtime, WorkItem
from durable_agent.signals import recovery_fault
from durable_agent.text import storable, storable_json

if TYPE_CHECKING:
    from durable_agent.models import Host


logger = logging.getLogger("durable_agent.maintenance")
MAX_ATTEMPTS = 2**31 - 1
RUN_RECOVERY = "run recovery"
READ_ABORT_INTENT = "read abort intent"


@dataclass
class NativeRecovery:
    """What one pass learned from recovery; shared by the attempt threads (hence the lock)."""

    pending: set[str] = field(default_factory=set)
    loaded: set[str] = field(default_factory=set)
    reports: dict[str, RecoveryReport] = field(default_factory=dict)
    faults: dict[str, RecoveryFault] = field(default_factory=dict)
    started: bool = False
    needs_checkpoint: bool = False
    recovered: int = 0
    repaired: bool = False
    discovery_pending: bool = False
    retry_at: datetime | None = None
    # The host has no recovery fault: begin found none, and the pass recorded none since
    # (Note [Begin knows the native step's records] in ``store/rows.py``).
    none_stored: bool = False
    lock: threading.RLock = field(default_factory=threading.RLock)


def failure_of(exc: BaseException, *, phase: str, operation: str) -> dict[str, Any]:
    """A payload-free description of a recovery failure."""
    return {
        "phase": phase,
        "reason": (
            "timeout"
            if isinstance(exc, RecoveryTimeout)
            else "defect"
            if not isinstance(exc, Exception)
            else "failure"
        ),
        "operation": operation,
        "diagnostic": {
            "error": storable(type_name(exc), limit=200),
            "message": storable(error_message(exc), limit=300),
        },
    }


def recover_thread(host: Host, runtime: Runtime, thread: str, recovery: NativeRecovery) -> None:
    """Sweep ``thread`` page by page, saving the cursor so a crash resumes where it stopped."""
    cursor = read_cursor(host.pk, thread)
    while True:
        try:
            sweep = bounded_call(
                RUN_RECOVERY, functools.partial(runtime.run_recovery, host, thread, cursor)
            )
        except RecoveryTimeout as exc:  # Note [A hung runtime call is abandoned]
            sweep = RecoverySweep(blocked=(blocked_failure(thread, exc, RUN_RECOVERY),))
        faults = record_recovery_faults(host, runtime, sweep, recovery, selected_thread=thread)
        write_cursor(host.pk, thread, sweep.cursor)
        with recovery.lock:
            for report in sweep.reports:
                recovery.reports[report.submission] = report
            recovery.faults.pop(thread, None)
            recovery.faults.update(faults)
            work = sweep.work_reports if sweep.work_reports is not None else sweep.reports
            recovery.recovered += len(work) + len(sweep.blocked)
            recovery.repaired |= any(r.disposition == "repaired" for r in work)
            for work_report in sweep.work_reports or ():
                if work_report.retry_at is not None:
                    recovery.retry_at = min(
                        recovery.retry_at or work_report.retry_at, work_report.retry_at
                    )
        cursor = None if sweep.blocked else sweep.cursor
        if cursor is None:
            return


def record_recovery_faults(
    host: Host,
    runtime: Runtime,
    sweep: RecoverySweep,
    recovery: NativeRecovery,
    *,
    current: list[WorkItem] | None = None,
    selected_thread: str | None = None,
) -> dict[str, RecoveryFault]:
    """Create, change or clear the faults a sweep reveals, with their events; return the faults."""
    recovery.none_stored = False  # the faults are read again from here on
    threads: dict[str, dict[str, Any] | None] = {}
    if selected_thread is not None:
        threads[selected_thread] = None
    for report in sweep.reports:
        threads[report.thread] = None
    for work_report in sweep.work_reports or ():
        threads[work_report.thread] = None
    for blocked in sweep.blocked:  # a runtime's own diagnostic: made storable
        threads[blocked.thread] = storable_json(blocked.failure)
    if not threads:
        return {}
    now = clock.now()
    if current is None:
        if sweep.blocked:
            with gate.native_source():
                current = runtime.scan_nonterminal(host)
        else:
            current = []
    subs = current

    def fn(tx: AlarmTx) -> tuple[dict[str, RecoveryFault], list[RecoveryFault]]:
        events: list[RecoveryEvent] = []
        faults: dict[str, RecoveryFault] = {}
        newly: list[RecoveryFault] = []
        for thread, failure in threads.items():
            prev = RecoveryFault.objects.filter(host_id=host.pk, thread=thread).first()
            prev_ids: list[str] = list(prev.recipients) if prev else []
            if failure is None:
                if prev is not None:
                    ids = prev_ids or [r.submission for r in sweep.reports if r.thread == thread]
                    events += [_event(prev, sid, "cleared", now) for sid in ids]
                    prev.delete()
                continue
            known = set(prev_ids)
            added = [s.submission for s in subs if s.thread == thread and s.submission not in known]
            attempts_before = prev.attempts if prev else 0
            fault = prev or RecoveryFault(host_id=host.pk, thread=thread, first_failed_at=now)
            previous_failure = prev.failure if prev else None
            fault.last_failed_at = now
            fault.attempts = min(MAX_ATTEMPTS, attempts_before + 1)
            fault.retry_at = now + timedelta(
                milliseconds=backoff.recovery_fault_delay_ms(attempts_before)
            )
            fault.failure = failure
            fault.recipients = prev_ids + added
            fault.save()
            if prev is not None and previous_failure != failure:
                events += [_event(fault, sid, "changed", now) for sid in prev_ids]
            events += [_event(fault, sid, "created", now) for sid in added]
            faults[thread] = fault
            if prev is None:
                newly.append(fault)
        append_recovery_events(tx, events)
        return faults, newly

    failpoints.hit("maintenance:recovery-status:before")
    faults, newly = run_alarm_transaction(host, "record recovery status", fn)
    failpoints.hit("maintenance:recovery-status:after")
    for fault in newly:
        log = logger.critical if fault.failure.get("reason") == "defect" else logger.error
        log(
            "Native Thread recovery blocked; accepted work remains pending",
            extra=log_extra(
                host, thread_key=fault.thread, failure=fault.failure, action="recovery_fault"
            ),
        )
    return faults


def _event(fault: RecoveryFault, submission: str, transition: str, now: datetime) -> RecoveryEvent:
    return RecoveryEvent(
        host_id=fault.host_id,
        transition=transition,
        thread=fault.thread,
        submission=submission,
        occurred_at=now,
        first_failed_at=fault.first_failed_at,
        failure=fault.failure,
    )


def append_recovery_events(tx: AlarmTx, events: list[RecoveryEvent]) -> None:
    """Number ``events`` after the host's last sequence and enroll the delivery lane."""
    if not events:
        return
    sequence = tx.state.recovery_event_sequence
    for event in events:
        sequence += 1
        event.sequence = sequence
    RecoveryEvent.objects.bulk_create(events)
    tx.state.recovery_event_sequence = sequence
    tx.queue.dirty(RECOVERY_EVENTS, EPOCH, progress=True)


def load_recovery_faults(
    host: Host,
    ids_by_thread: dict[str, list[str]],
    recovery: NativeRecovery,
    selection_time: datetime,
) -> None:
    """Load the faults of the scanned threads; new admissions on a faulted thread become
    recipients (with a ``created`` event) without accelerating its retry."""
    unloaded = [t for t in ids_by_thread if t not in recovery.loaded]
    if unloaded and not recovery.none_stored:
        for fault in RecoveryFault.objects.filter(host_id=host.pk, thread__in=unloaded):
            recovery.faults[fault.thread] = fault
    recovery.loaded.update(unloaded)
    for thread, ids in ids_by_thread.items():
        known = recovery.faults.get(thread)
        if known is None or all(sid in known.recipients for sid in ids):
            continue

        def fn(tx: AlarmTx, thread: str = thread, ids: list[str] = ids) -> RecoveryFault | None:
            current = RecoveryFault.objects.filter(host_id=host.pk, thread=thread).first()
            if current is None:
                return None
            added = [sid for sid in ids if sid not in current.recipients]
            if added:
                current.recipients = [*current.recipients, *added]
                current.save(update_fields=["recipients"])
                append_recovery_events(
                    tx, [_event(current, sid, "created", selection_time) for sid in added]
                )
            return current

        updated = run_alarm_transaction(host, "record recovery recipients", fn)
        if updated is None:
            recovery.faults.pop(thread, None)
        else:
            recovery.faults[thread] = updated


def blocked_failure(thread: str, exc: BaseException, operation: str) -> Blocked:
    return Blocked(thread=thread, failure=failure_of(exc, phase="recovery", operation=operation))


def deliver_recovery_events(ctx: LaneContext) -> datetime | None:
    """The recovery-events lane: send each undelivered event to ``recovery_fault``, in order."""
    host = ctx.host
    while not ctx.cancelled():
        state = MaintenanceState.objects.get(host_id=host.pk)
        sequence = state.recovery_event_acknowledged + 1
        if sequence > state.recovery_event_sequence:
            return None
        event = RecoveryEvent.objects.get(host_id=host.pk, sequence=sequence)
        recovery_fault.send(sender=RecoveryEvent, host=host, event=event)
        delivered_at = clock.now()

        def ack(
            tx: AlarmTx, sequence: int = sequence, delivered_at: datetime = delivered_at
        ) -> None:
            if tx.state.recovery_event_acknowledged < sequence:
                tx.state.recovery_event_acknowledged = sequence
                RecoveryEvent.objects.filter(host_id=host.pk, sequence=sequence).update(
                    delivered_at=delivered_at
                )

        run_alarm_transaction(host, "acknowledge recovery event", ack)
    return ctx.now()


def validate_cursor_text(cursor: object) -> str:
    """A work cursor is a non-empty string of at most 8192 characters."""
    if not isinstance(cursor, str) or not cursor:
        raise InvalidInput("A work cursor must be a non-empty string", cursor=cursor)
    if len(cursor) > MAX_CURSOR_LENGTH:
        raise InvalidInput(
            f"A work cursor has at most {MAX_CURSOR_LENGTH} characters, not {len(cursor)}",
            length=len(cursor),
        )
    return cursor


def read_cursor(host_id: int, thread: str) -> str | None:
    """The saved cursor of ``thread``, or None."""
    value: str | None = (
        WorkCursor.objects.filter(host_id=host_id, thread=thread)
        .values_list("cursor", flat=True)
        .first()
    )
    return value


def write_cursor(host_id: int, thread: str, cursor: str | None) -> None:
    """Save ``cursor`` for ``thread``; None deletes it (the sweep finished)."""
    if cursor is None:
        WorkCursor.objects.filter(host_id=host_id, thread=thread).delete()
        return
    WorkCursor.objects.update_or_create(
        host_id=host_id, thread=thread, defaults={"cursor": validate_cursor_text(cursor)}
    )
