"""The native step of a pass: scan, discover, recover, select, attempt, checkpoint (6.4, 6.5).

``run_native`` runs the phases in order, each in its own module, over the pass (``state.py``):
observe the ledger (``observe.py``), select the heads and the old-work backlog
(``selection.py``), attempt the heads while the backlog is recovered (``attempts.py``), then
acknowledge or back off (``checkpoint.py``).

Note [Select again after recovery]
    Upstream's scheduling loop advances again once old-work recovery finished, dispatching
    when no attempt has settled yet: the recovery reports can release a thread (an unknown
    head becomes a stable wait, an expired lease becomes ``ready``). The port keeps that one
    refill: when the first selection dispatched nothing and the backlog was swept, the pass
    observes and selects once more before its checkpoint.
"""

from __future__ import annotations

from durable_agent import clock
from durable_agent.maintenance.lanes.native.attempts import dispatch
from durable_agent.maintenance.lanes.native.checkpoint import checkpoint
from durable_agent.maintenance.lanes.native.observe import observe
from durable_agent.maintenance.lanes.native.selection import select
from durable_agent.maintenance.lanes.native.state import Pass


def run_native(p: Pass) -> None:
    """Run the native step of a pass whose begin charged the native lane."""
    view = observe(p)
    selected, backlog = select(p, view)
    dispatch(p, view, selected, backlog)
    if backlog and not selected and clock.now() < p.yield_at:
        view = observe(p)  # Note [Select again after recovery]
        selected, _ = select(p, view)
        dispatch(p, view, selected, [])
    checkpoint(p)
