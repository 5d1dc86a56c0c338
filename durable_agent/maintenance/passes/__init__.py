"""The maintenance pass: the pass object, its phases, and what it runs (docs/pass.md).

In the order a pass meets them: ``run.py`` (``run_pass``, ``begin`` and the general path
around the native step, failure handling), ``state.py`` (``Pass``, the pass object, and its lease),
``ensure.py`` (``ensure_alarm``, the binding registry check and framework lanes it shares with
``begin``, ``report_parked``), ``native.py`` (``run_native``, the native step by phase),
``waves.py`` (one wave's life: charge, run, complete; the waves around the native step, the
publication barrier, and a caught-up pass's nothing or one wave), ``finish.py`` (the event
deadline, the finish decision, ``rearm_failure``, ``PassReport`` and its row). What a pass
runs: ``lane_registry.py`` (the lane handlers and the phase table), ``pool.py`` (the pass's
thread pool and bounded runtime calls), ``recovery.py`` (native recovery, its events lane and
work cursors).

The names below are the pass's public surface; the modules of ``durable_agent.maintenance``
import them from the modules that define them.
"""

from durable_agent.maintenance.passes.ensure import ensure_alarm, report_parked
from durable_agent.maintenance.passes.finish import PassReport, rearm_failure
from durable_agent.maintenance.passes.run import run_pass

__all__ = ["PassReport", "ensure_alarm", "rearm_failure", "report_parked", "run_pass"]
