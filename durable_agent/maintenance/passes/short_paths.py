"""The short paths of a caught-up pass: nothing or one lane wave to run.

``short_path`` says what a caught-up pass has to run; inside the begin transaction
(``durable_agent/maintenance/passes/run.py``) ``quick`` finishes a pass with nothing to run,
or charges the one wave, which ``one_wave`` runs and completes together with the finish
(Note [Nothing or one wave to run]).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from durable_agent import clock, observability
from durable_agent.errors import LaneNotRegistered
from durable_agent.maintenance import failpoints
from durable_agent.maintenance.lane_ids import PUBLICATION
from durable_agent.maintenance.passes import lane_registry
from durable_agent.maintenance.passes.finish import check_deadline, settle_alarm
from durable_agent.maintenance.passes.lane_registry import LaneSpec
from durable_agent.maintenance.passes.pass_records import report_of, write_record
from durable_agent.maintenance.passes.state import Pass
from durable_agent.maintenance.passes.waves import (
    OverrunFlag,
    admissible,
    charge_in,
    complete_in,
    complete_wave,
    run_claimed,
    validate_lanes,
)
from durable_agent.maintenance.store import lease
from durable_agent.maintenance.store.transactions import AlarmTx, run_alarm_transaction
from durable_agent.maintenance.types import Lane, LaneContext
from durable_agent.models import PassPhase

# Note [Nothing or one wave to run]
#     Most passes of a busy deployment find the host caught up (no native work) with nothing
#     or one lane wave to run: a duplicate delivery, a host whose slot outlived its work, a
#     host with one due outbox lane. Each transaction is a round trip per statement and a
#     commit, and the pass's total is what a burst of due hosts is drained at, so such a pass
#     does its steps in two transactions, or one, instead of four:
#
#     - nothing to run: the begin transaction also makes the finish decision (re-arm at the
#       earliest lane deadline, or disarm) and writes the ``PassRecord``; no lease is taken
#       (it would be released in the same commit), so the slot is written at most once;
#     - one concurrent wave: the begin transaction also charges it (the claim and the slot
#       within the lease, exactly what the wave's own charge transaction did, Note [Charge
#       before fallible work]); the handler then runs on the pass's own thread, and one
#       transaction completes the lane, releases the lease, makes the finish decision and
#       writes the ``PassRecord``. A failing handler is completed with backoff in its own
#       transaction and fails the pass as before (``rearm_failure``).
#
#     Anything else (the native step, a due or parked publication lane, a due after-native
#     lane, several waves, a due lane without a handler) takes the general path. The
#     failpoints keep their meaning: ``begin:before`` before the first transaction,
#     ``begin:after`` and ``finish:before`` around the handler, ``finish:after`` after the last.


NOTHING = "nothing"


def short_path(p: Pass, now: datetime) -> str | tuple[LaneSpec, Lane] | None:
    """What a caught-up pass has to run: ``NOTHING``, one concurrent wave, or None for the
    general path (Note [Nothing or one wave to run])."""
    rows, producing = p.rows, p.producing
    try:
        validate_lanes(rows)
    except LaneNotRegistered:
        return None  # the general path fails the pass
    by_lane = {row.lane: row for row in rows}
    publication = by_lane.get(PUBLICATION)
    if publication is not None and (publication.due_at is not None or publication.parked):
        return None  # the publication barrier
    waves: list[tuple[LaneSpec, Lane]] = []
    for row in admissible(rows, producing, now):
        found = lane_registry.handler(row.lane)
        if found is None or lane_registry.step_of(found) != lane_registry.BESIDE_NATIVE:
            return None  # Note [Lane phases]: the general path runs every other step
        waves.append((found, row))
    if not waves:
        return NOTHING
    if len(waves) > 1:
        return None
    spec, row = waves[0]
    allowance = timedelta(milliseconds=spec.allowance_ms)
    if now >= p.yield_at or now + allowance > p.dispatch_end:
        return None
    return spec, row


def quick(tx: AlarmTx, p: Pass, active: int, now: datetime) -> None:
    """Inside the begin transaction of a caught-up pass: finish a pass with nothing to run,
    or charge its one wave (Note [Nothing or one wave to run])."""
    p.rows = tx.queue.read()
    plan = short_path(p, now)
    if plan is None:
        return
    if not isinstance(plan, tuple):  # NOTHING
        assert isinstance(p.lease, lease.Lease)
        lease.release_in(tx.state, p.lease)
        p.alarm, p.parked = settle_alarm(tx, p.generation, None, active, now)
        p.finished = True
        report = report_of(p, PassPhase.CAUGHT_UP.value)
        write_record(tx.host, p.started_at, report, deadline=p.slot_time)
        return
    spec, row = plan
    claimed = charge_in(tx, row, now)
    if claimed is not None:
        p.wave = (spec, claimed, now)


def one_wave(p: Pass, taken: lease.Lease) -> None:
    """Run the wave begin claimed, then complete it and finish the pass in one transaction
    (Note [Nothing or one wave to run])."""
    assert p.wave is not None
    spec, claimed, charged_at = p.wave
    p.saw(p.rows)
    allowance = timedelta(milliseconds=spec.allowance_ms)
    context = LaneContext(
        host=p.host,
        lane=spec.lane,
        deadline=charged_at + allowance,
        _cancelled=OverrunFlag(charged_at + allowance + timedelta(seconds=1)),
    )
    with observability.span(
        "durable_agent.wave", host_key=p.host.key, host_id=p.host.pk, lane=spec.lane
    ):
        outcome, failure = run_claimed(spec.lane, lambda: spec.run(context), charged_at, allowance)
    if failure is not None:
        complete_wave(p, claimed, None, failure)
        raise failure
    check_deadline(p.event_deadline)
    failpoints.hit("maintenance:finish:before")
    jitter = clock.random()

    def fn(tx: AlarmTx) -> None:
        now = clock.now()
        active, producing = tx.producing_lanes(now)
        complete_in(tx.queue, claimed, outcome, None, producing, jitter)
        lease.release_in(tx.state, taken)
        p.alarm, p.parked = settle_alarm(tx, p.generation, None, active, now)
        report = report_of(p, PassPhase.CAUGHT_UP.value)
        write_record(tx.host, p.started_at, report, deadline=p.slot_time)

    run_alarm_transaction(p.host, "finish maintenance event", fn)
