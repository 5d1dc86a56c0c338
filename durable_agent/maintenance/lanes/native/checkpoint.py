"""The native step's checkpoint: acknowledge what the pass observed, or back off.

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
    and the native lane due at the earliest such ``not_before`` (never sooner, and without the
    no-progress backoff when nothing else is autonomous), so the pass at that time attempts it.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from durable_agent import clock, conf
from durable_agent.maintenance import backoff, failpoints
from durable_agent.maintenance.lanes.native.observe import observe, skipped
from durable_agent.maintenance.lanes.native.state import Pass
from durable_agent.maintenance.store.transactions import AlarmTx, run_alarm_transaction
from durable_agent.models import BindingRetry
from durable_agent.runtime import WorkItem


def checkpoint(step: Pass) -> None:
    """Acknowledge what was observed, or back off; never writes the slot itself. Leaves the
    native lane's next time in ``step.next_at`` and the work remaining in ``step.nonterminal``."""
    view = observe(step)
    recovery, observed = step.recovery, step.generation
    assert observed is not None
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
            if delayed and not waits and item.not_before is not None:  # Note [Delayed heads]
                timed.append(item.not_before)
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

    def fn(tx: AlarmTx) -> datetime | None:
        state = tx.state
        active = tx.live_ticket_count(now)
        overlap = step.active_at_start > 0 or active > 0
        generation = (
            view.scanned_generation
            if not remaining
            and not view.owners
            and not overlap
            and state.dirty == view.scanned_generation
            else observed
        )
        if not (autonomous or overlap):
            state.processed = max(state.processed, generation)
        can_backoff = not overlap and state.dirty == observed
        tx.clear_retry()
        state.nonterminal = len(remaining)
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
        tx.queue.checkpoint_native(due)
        return due

    failpoints.hit("maintenance:checkpoint:before")
    step.next_at = run_alarm_transaction(step.host, "checkpoint maintenance generation", fn)
    failpoints.hit("maintenance:checkpoint:after")
    step.nonterminal = len(remaining)


def _min_delay() -> timedelta:
    return conf.minimum_alarm_delay()
