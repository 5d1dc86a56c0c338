"""Recovery of the reference ledger: expired leases, abort intents, unknown outcomes.

``run_recovery`` sweeps one thread's nonterminal submissions in pages of ``PAGE_SIZE``,
FIFO; the cursor is the last sequence of the page. Per submission:

=============================================  ==================  ===============  ===========
submission                                     becomes             decision         disposition
=============================================  ==================  ===============  ===========
running, lease expired, abort requested        settled / aborted   SettleAborted    repaired
running, lease expired, retry-safe agent or    ready               ApplyInput       repaired
no side effect marked
running, lease expired, side effect marked,    unknown             MarkUnknown      unknown
agent not retry-safe (or not registered)
ready with an abort intent (defensive: abort()  settled / aborted   SettleAborted    repaired
settles ready rows itself)
unknown                                        (unchanged)         AwaitUnknown-    unknown
                                                                   Resolution
=============================================  ==================  ===============  ===========

A running submission whose lease is still live yields a work report with ``retry_at`` = its
expiry, so the pass wakes up exactly when recovery can act. The writes of a page commit in one
``gate.transaction`` with native progress (the pass calls under ``gate.native_source()``, so
they do not advance the generation).
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db.models import Q

from durable_agent import clock, signals
from durable_agent.agents import registry, transitions
from durable_agent.errors import InvalidInput
from durable_agent.maintenance import gate
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.maintenance.passes.recovery import blocked_failure
from durable_agent.models import Host, Submission, SubmissionOutcome, SubmissionState, Thread
from durable_agent.observability import log_extra
from durable_agent.runtime import DiscoveryPage, RecoveryReport, RecoverySweep, WorkReport

logger = logging.getLogger("durable_agent.agents")
PAGE_SIZE = 32


def discover_work_threads(host: Host, after: str | None, limit: int) -> DiscoveryPage:
    """Thread keys (sorted, > ``after``) owning submissions recovery would change now.

    That is an expired lease or a ``ready`` submission with an abort intent. ``unknown``
    submissions are not included: they are stable waits, and the pass finds unknown heads
    in its scan anyway. Keys are compared in Python (code point order), like the pass does.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInput(f"limit must be a positive int, not {limit!r}", limit=limit)
    now = clock.now()
    owners = (
        Submission.objects.nonterminal()
        .filter(host=host)
        .filter(
            Q(state=SubmissionState.RUNNING, lease_expires_at__lte=now)
            | Q(state=SubmissionState.READY, abort_requested_at__isnull=False)
        )
        .values_list("thread__key", flat=True)
    )
    keys = sorted({key for key in owners if after is None or key > after})
    page = keys[:limit]
    return DiscoveryPage(tuple(page), page[-1] if len(keys) > limit else None)


def run_recovery(host: Host, thread: str, cursor: str | None) -> RecoverySweep:
    """Recover one page of ``thread``; a failure becomes a ``Blocked`` thread (no payload)."""
    try:
        return _sweep(host, thread, _after(thread, cursor))
    except Exception as exc:  # outside every transaction: reported, never swallowed
        logger.warning(
            "Recovery of thread %r failed",
            thread,
            exc_info=True,
            extra=log_extra(host, thread_key=thread, action="recovery_failed"),
        )
        return RecoverySweep(blocked=(blocked_failure(thread, exc, "run recovery"),))


def _after(thread: str, cursor: str | None) -> int | None:
    if cursor is None:
        return None
    if cursor.isascii() and cursor.isdigit():
        return int(cursor)
    logger.warning("Ignoring malformed recovery cursor %r of thread %r", cursor, thread)
    return None  # sweeping again from the start is safe: recovery is idempotent


def _sweep(host: Host, thread: str, after: int | None) -> RecoverySweep:
    thread_id = Thread.objects.filter(host=host, key=thread).values_list("pk", flat=True).first()
    if thread_id is None:
        return RecoverySweep()
    reports: list[RecoveryReport] = []
    live: list[datetime] = []
    with gate.transaction(host) as tx:
        now = clock.now()
        query = Submission.objects.nonterminal().filter(thread_id=thread_id)
        if after is not None:
            query = query.filter(sequence__gt=after)
        rows = list(query.select_for_update(of=("self",)).order_by("sequence")[: PAGE_SIZE + 1])
        more, rows = len(rows) > PAGE_SIZE, rows[:PAGE_SIZE]
        changed = False
        for row in rows:
            report = _recover(row, thread, now, live)
            if report is not None:
                reports.append(report)
                changed |= report.decision != "AwaitUnknownResolution"
        if changed:
            tx.record_progress([NATIVE])
    work_reports = None
    if live:  # work_reports replaces reports in the pass's accounting: list both
        work_reports = (
            *(WorkReport(r.thread, r.disposition) for r in reports),
            WorkReport(thread, "unchanged", retry_at=min(live)),
        )
    return RecoverySweep(
        reports=tuple(reports),
        work_reports=work_reports,
        cursor=str(rows[-1].sequence) if more else None,
    )


def _recover(
    row: Submission, thread: str, now: datetime, live: list[datetime]
) -> RecoveryReport | None:
    """Decide and apply recovery for one locked row; None when nothing is owed."""
    submission = str(row.pk)
    if row.state == SubmissionState.UNKNOWN:
        return RecoveryReport(thread, submission, "AwaitUnknownResolution", "unknown")
    if row.state == SubmissionState.READY and row.abort_requested_at is not None:
        if Submission.objects.filter(pk=row.pk, state=SubmissionState.READY).update(
            **transitions.settled(SubmissionOutcome.ABORTED, now)
        ):
            signals.submission_settled_on_commit(row.pk, row.host_id, SubmissionOutcome.ABORTED)
        return RecoveryReport(thread, submission, "SettleAborted", "repaired")
    if row.state != SubmissionState.RUNNING or row.lease_expires_at is None:
        return None
    if row.lease_expires_at > now:
        live.append(row.lease_expires_at)
        return None
    spec = registry.lookup(row.agent, row.agent_version)
    retry_safe = spec is not None and spec.retry_safe
    if row.abort_requested_at is not None:
        fields = transitions.settled(SubmissionOutcome.ABORTED, now)
        report = RecoveryReport(thread, submission, "SettleAborted", "repaired")
    elif retry_safe or not row.side_effect_marked:
        fields = transitions.ready(now)
        report = RecoveryReport(thread, submission, "ApplyInput", "repaired")
    else:
        fields = transitions.unknown(now)
        report = RecoveryReport(thread, submission, "MarkUnknown", "unknown")
    updated = Submission.objects.filter(
        pk=row.pk,
        state=SubmissionState.RUNNING,
        lease_owner=row.lease_owner,
        lease_expires_at__lte=now,
    ).update(**fields)
    if updated != 1:
        return None  # renewed or settled by its owner meanwhile: nothing to repair
    if fields["state"] == SubmissionState.SETTLED:
        signals.submission_settled_on_commit(row.pk, row.host_id, SubmissionOutcome.ABORTED)
    if fields["state"] == SubmissionState.UNKNOWN:
        signals.needs_operator_on_commit(
            host_id=row.host_id,
            submission_id=row.pk,
            thread=thread,
            agent=row.agent,
            version=row.agent_version,
            reason="unknown",
        )
    logger.info(
        "Recovered submission %s of thread %r after its lease expired: %s",
        row.pk,
        thread,
        report.decision,
        extra=log_extra(
            row.host_id,
            thread_key=thread,
            submission_id=row.pk,
            decision=report.decision,
            action="recovered",
        ),
    )
    return report
