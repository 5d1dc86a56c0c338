"""The maintenance pass: the pass object, its phases, and what it runs (docs/pass.md).

``state.py`` (``Pass``, the pass object), ``native.py`` (``run_native``, the native step by
phase), ``lane_registry.py`` (the lane handlers and the phase table), ``waves.py`` (one lane
wave: charge, run, complete), ``pool.py`` (the pass's thread pool and bounded runtime calls),
``recovery.py`` (native recovery, its events lane and work cursors).

``run.py`` (``run_pass``: the begin transaction, the general path around the native step,
failure handling), ``ensure.py`` (``ensure_alarm``, the binding registry check and framework
lanes it shares with the pass, ``report_parked``),
``short_paths.py`` (a caught-up pass with nothing or one wave to run), ``pass_waves.py`` (the
waves around the native step and the publication barrier), ``finish.py`` (the event deadline,
the finish decision, ``rearm_failure``) and ``pass_records.py`` (``PassReport`` and its row).

The names below are the pass's public surface; the modules of ``durable_agent.maintenance``
import them from the modules that define them.
"""

from durable_agent.maintenance.passes.ensure import ensure_alarm, report_parked
from durable_agent.maintenance.passes.finish import rearm_failure
from durable_agent.maintenance.passes.pass_records import PassReport
from durable_agent.maintenance.passes.run import run_pass

__all__ = ["PassReport", "ensure_alarm", "rearm_failure", "report_parked", "run_pass"]
