"""The native step's selection: the heads to attempt, round-robin, and the old-work backlog.

Note [Stable waits are not swept]
    Upstream sweeps every head that is not eligible, stable waits included. A thread whose head
    waits on an external mutation (approval, unknown resolution, a parked binding) has nothing
    recovery can do until that mutation arrives, and the mutation advances the generation
    itself; sweeping it again every pass would keep a host with many waits autonomous forever.
    So the old-work backlog holds the heads and the discovered work owners that are not
    eligible, minus every thread whose head waits.
"""

from __future__ import annotations

from durable_agent import clock
from durable_agent.maintenance import failpoints
from durable_agent.maintenance.lanes.native.observe import DISCOVERY_LIMIT, View
from durable_agent.maintenance.lanes.native.state import Pass
from durable_agent.maintenance.store.transactions import AlarmTx, run_alarm_transaction


def select(step: Pass, view: View) -> tuple[list[str], list[str]]:
    recovery = step.recovery
    waiting_threads = {w.thread for w in view.waits}
    runnable = [t for t in view.eligible if t not in waiting_threads]
    selection_time = clock.now()

    failpoints.hit("maintenance:select:before")

    def fn(tx: AlarmTx) -> tuple[list[str], list[str], bool]:
        state = tx.state
        last = state.last_served_thread
        pivot = next((i for i, t in enumerate(runnable) if last is None or t > last), 0)
        selected = (runnable[pivot:] + runnable[:pivot])[: step.slots]
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

    selected, backlog, overflow = run_alarm_transaction(step.host.pk, "select maintenance work", fn)
    failpoints.hit("maintenance:select:after")
    if not recovery.started:
        recovery.started = True
        recovery.needs_checkpoint = bool(backlog)
        recovery.discovery_pending |= overflow
        recovery.pending |= set(backlog)
    return selected, backlog
