"""The native step's observation: scan the ledger, discover work owners, pick each thread's head.

Note [An unknown head does not hold up its thread]
    As upstream: an ``unknown`` submission that recovery reported as a stable wait is skipped
    when the pass picks each thread's head, so the submission behind it becomes the head and
    runs. Recovery reports it in the pass's first sweep of the thread (old-work recovery), so
    the pass selects a second time after that sweep when nothing was dispatched yet (Note
    [Select again after recovery]). A ``WorkItem`` with ``holds_thread`` (an agent registered
    with ``strict_order=True``) is not skipped: its thread waits with it (Note [Followers
    behind a stable wait]).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from durable_agent import clock
from durable_agent.maintenance.lanes.native.state import Pass
from durable_agent.maintenance.lanes.pool import bounded_call
from durable_agent.maintenance.lanes.recovery import (
    READ_ABORT_INTENT,
    blocked_failure,
    load_recovery_faults,
    record_recovery_faults,
)
from durable_agent.maintenance.mutations import gate
from durable_agent.models import BindingRetry, MaintenanceState
from durable_agent.runtime import RecoverySweep, WorkItem, stable_external_wait

DISCOVERY_LIMIT = 32


@dataclass
class View:
    """One control-state observation of the ledger."""

    scanned_generation: int
    current: list[WorkItem]
    owners: tuple[str, ...]
    heads: dict[str, WorkItem]
    eligible: list[str]
    waits: list[BindingRetry]
    waiting: Callable[[WorkItem], bool]


def observe(step: Pass) -> View:
    host, runtime, recovery = step.host, step.runtime, step.recovery
    # The generation this scan answers for, read before it: a producer may have advanced it
    # since begin. The rest of the state row is the pass's own (read by begin, kept by it).
    scanned_generation = (
        MaintenanceState.objects.filter(host_id=host.pk).values_list("dirty", flat=True).get()
    )
    cursor = step.last_recovered_thread
    with gate.native_source():
        current = list(runtime.scan_nonterminal(host))
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
    )


def stopping_threads(step: Pass, heads: dict[str, WorkItem], current: list[WorkItem]) -> set[str]:
    """Ready heads with an accepted abort: recovery settles them, no attempt runs."""
    stopping: set[str] = set()
    for head in heads.values():
        if (
            head.state != "ready"
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
