"""The native step of a pass: scan, discover, recover, select, attempt, checkpoint (6.4, 6.5).

``NativeStep.run`` runs the phases in order, each in its own module over the shared
``NativeState`` (``state.py``): observe the ledger (``observe.py``), select the heads and the
old-work backlog (``selection.py``), attempt the heads while the backlog is recovered
(``attempts.py``), then acknowledge or back off (``checkpoint.py``).

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
from durable_agent.maintenance.lanes.native.state import NativeResult, NativeState


class NativeStep(NativeState):
    """Runs the native step of one pass for one host."""

    def run(self) -> NativeResult:
        if not self.started.actionable:
            return NativeResult("caught-up", self.started.nonterminal, None)
        view = observe(self)
        selected, backlog = select(self, view)
        dispatch(self, view, selected, backlog)
        if backlog and not selected and clock.now() < self.yield_after:
            view = observe(self)  # Note [Select again after recovery]
            selected, _ = select(self, view)
            dispatch(self, view, selected, [])
        return checkpoint(self)
