"""The maintenance pass: one bounded, idempotent run of one host, started by its alarm.

``run_pass(host)`` takes the host's pass lease (a concurrent pass returns ``busy`` at once),
begins (the O(1) caught-up path makes a constant number of queries), runs the concurrent lane
waves beside the native step, then the after-native waves, and finishes by re-arming or
clearing the slot. Any failure first schedules bounded, durable recovery (``rearm_failure``)
and is then re-raised, so the alarm always stays armed while work remains.

The phases live beside it: ``ensure.py`` (the registry check, lane registration and parked
notices it shares with ``ensure_alarm``), ``short_paths.py`` (a caught-up pass with nothing or
one wave to run), ``pass_waves.py`` (the waves around the native step), ``finish.py`` (the
finish decision and ``rearm_failure``) and ``pass_records.py`` (``PassReport`` and its row).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta

from durable_agent import clock, conf, observability
from durable_agent.errors import HostNotFound, PassError, PassFailed, is_stop
from durable_agent.maintenance import failpoints
from durable_agent.maintenance.lane_ids import NATIVE, PUBLICATION
from durable_agent.maintenance.lanes.native.state import NativeResult, Started
from durable_agent.maintenance.lanes.native.step import NativeStep
from durable_agent.maintenance.lanes.pool import Executor
from durable_agent.maintenance.lanes.waves import (
    Observation,
    charge_in,
    join,
    observe_claim,
    validate_lanes,
)
from durable_agent.maintenance.passes import lease
from durable_agent.maintenance.passes.ensure import (
    read_current_state,
    register_framework_lanes,
    report_parked,
)
from durable_agent.maintenance.passes.finish import (
    check_deadline,
    finish,
    rearm_failure,
    settle_alarm,
)
from durable_agent.maintenance.passes.pass_records import (
    MAX_PASS_ERROR_LENGTH,
    PassReport,
    record,
    recorded,
    write_record,
)
from durable_agent.maintenance.passes.pass_waves import (
    admit_waves,
    after_native,
    publication_barrier,
    refill_waves,
)
from durable_agent.maintenance.passes.short_paths import Begun, one_wave, short_path
from durable_agent.maintenance.store.transactions import (
    AlarmTx,
    resolve_host_id,
    run_alarm_transaction,
)
from durable_agent.maintenance.types import EPOCH, Lane
from durable_agent.models import Host, PassPhase
from durable_agent.runtime import Runtime, get_runtime
from durable_agent.text import error_text

logger = logging.getLogger("durable_agent.maintenance")
log_extra = observability.log_extra


def run_pass(
    host: Host | str | int, *, deadline: datetime | None = None, guard: bool = False
) -> PassReport:
    """Run one maintenance pass of ``host`` and record it, in a ``durable_agent.pass`` span.

    Args:
        host: the host (a Host, its key or its id).
        deadline: the alarm deadline this pass was fired for (for the lateness figure).
        guard: apply the early-fire guard (alarm deliveries): a delivery whose slot moved
            later, or with nothing due, returns phase ``stale`` and runs nothing.

    Raises:
        Whatever failed the pass, after ``rearm_failure`` scheduled durable recovery; a
        failure that is not an ``Exception`` as a :class:`PassError`, unless it is the
        process being stopped (Note [A stop is not a failure] in ``durable_agent/errors.py``).
    """
    with observability.span("durable_agent.pass") as current:
        try:
            report = _run_pass(host, deadline=deadline, guard=guard)
        except BaseException as exc:
            if isinstance(exc, Exception) or is_stop(exc):
                raise
            raise PassError(error_text(exc, limit=MAX_PASS_ERROR_LENGTH)) from exc
        current.set_attribute("durable_agent.host_key", report.host)
        current.set_attribute("durable_agent.phase", report.phase)
        return report


def _run_pass(host: Host | str | int, *, deadline: datetime | None, guard: bool) -> PassReport:
    # An id is read by the pass's first transaction (with the lanes), not by a query before it.
    ref = host if isinstance(host, int) and not isinstance(host, bool) else _host(host)
    started_at = clock.now()
    lateness = (
        None if deadline is None else int((started_at - deadline) / timedelta(milliseconds=1))
    )
    observed = Observation()
    begun = _begin(
        ref,
        observed,
        get_runtime(),
        fired_for=deadline if guard else None,
        started_at=started_at,
        deadline=deadline,
        lateness=lateness,
    )
    host_obj = begun.host
    taken = begun.lease
    if isinstance(taken, lease.Stale):
        logger.debug(
            "Stale alarm delivery: %s",
            taken.reason,
            extra=log_extra(host_obj, phase="stale", action="pass"),
        )
        return PassReport(host=host_obj.key, phase="stale", lateness_ms=lateness)
    if isinstance(taken, lease.Busy):
        report = PassReport(host=host_obj.key, phase=PassPhase.BUSY.value, lateness_ms=lateness)
        record(host_obj, started_at, report, deadline=deadline)
        return report
    if begun.finished is not None:  # Note [Nothing or one wave to run]
        return recorded(host_obj, started_at, begun.finished, begun.parked)
    released = False
    try:
        with lease.heartbeat(taken):
            try:
                failpoints.hit("maintenance:begin:after")
                if begun.wave is not None:
                    finished, parked = one_wave(
                        host_obj, started_at, observed, begun, taken, deadline, lateness
                    )
                    released = True
                    return recorded(host_obj, started_at, finished, parked)
                result, phase, recovered, settled = _run_event(
                    host_obj, started_at, observed, begun
                )
                alarm, parked = finish(host_obj, observed, result, taken)
                released = True
            except BaseException as exc:
                try:
                    rearm_failure(host_obj, observed)
                except Exception:
                    logger.exception(
                        "Backing off a failed pass failed",
                        extra=log_extra(host_obj, action="rearm_failure"),
                    )
                failed = PassReport(
                    host=host_obj.key,
                    phase=PassPhase.FAILED.value,
                    lateness_ms=lateness,
                    generation=observed.generation,
                )
                record(host_obj, started_at, failed, deadline=deadline, error=exc)
                raise
    finally:
        if not released:
            lease.release(taken)
            report_parked(host_obj.pk)
    if parked:
        report_parked(host_obj.pk)
    report = PassReport(
        host=host_obj.key,
        phase=phase,
        recovered=recovered,
        settled=settled,
        nonterminal=result.nonterminal,
        alarm=alarm,
        generation=observed.generation,
        lateness_ms=lateness,
    )
    record(host_obj, started_at, report, deadline=deadline)
    return report


def _host(host: Host | str | int) -> Host:
    if isinstance(host, Host) and host.pk is not None:
        return host
    found = Host.objects.filter(pk=resolve_host_id(host, verify=False)).first()
    if found is None:
        raise HostNotFound(f"No host {host!r}", host=host)
    return found


def _run_event(
    host: Host, started_at: datetime, observed: Observation, begun: Begun
) -> tuple[NativeResult, str, int, int]:
    runtime = get_runtime()
    yield_after = started_at + conf.yield_after()
    dispatch_until = started_at + conf.dispatch_until()
    event_deadline = started_at + conf.event_timeout()
    started, rows, producing = begun.started, begun.rows, begun.producing
    assert started is not None
    for row in rows:
        observed.queue.setdefault(row.lane, row)
        if row.lane not in producing:
            observed.available[row.lane] = row.revision
    validate_lanes(rows)
    executor = Executor(conf.pass_workers())
    failures: list[BaseException] = []
    try:
        waves = admit_waves(host, rows, producing, observed, yield_after, dispatch_until, executor)
        native = NativeStep(host, runtime, started, yield_after, executor)
        observed.native_only = started.actionable and not waves
        try:
            pending = publication_barrier(host, rows, observed, yield_after, dispatch_until)
            if pending is not None:
                native.started = replace(started, actionable=False)
                result = NativeResult("caught-up", started.nonterminal, pending.next_at)
            else:
                result = native.run()
        except BaseException as exc:
            failures.append(exc)
            result = NativeResult("caught-up", started.nonterminal, None)
        else:
            observed.native_only = False
        failures += join(waves)
        if not failures and native.started.actionable:  # Note [Deliver what the pass produced]
            refill = refill_waves(host, waves, observed, yield_after, dispatch_until, executor)
            failures += join(refill)
        failures += after_native(host, observed, yield_after, dispatch_until, executor)
    finally:
        executor.shutdown()
    if failures:
        raise combined(failures)
    check_deadline(event_deadline)
    phase = PassPhase.ACTIONABLE.value if started.actionable else result.phase
    return result, phase, native.recovery.recovered, native.settled


def combined(failures: list[BaseException]) -> BaseException:
    """The one error a pass raises for all of its failures: the failure itself when
    there is one, else a :class:`PassFailed` carrying each. An interruption that is not an
    ``Exception`` (``KeyboardInterrupt``, ``SystemExit``) propagates as it is."""
    for failure in failures:
        if not isinstance(failure, Exception):
            return failure
    if len(failures) == 1:
        return failures[0]
    return PassFailed([f for f in failures if isinstance(f, Exception)])


def _begin(
    host: Host | int,
    observed: Observation,
    runtime: Runtime,
    *,
    fired_for: datetime | None,
    started_at: datetime,
    deadline: datetime | None,
    lateness: int | None,
) -> Begun:
    """Take the lease and ``begin_pass`` under the generation snapshot, in one short
    transaction: charge the native lane once (docs/pass.md, step 1). A caught-up pass with
    nothing or one wave to run goes further in the same transaction (Note [Nothing or one
    wave to run])."""
    failpoints.hit("maintenance:begin:before")
    now = clock.now()

    def fn(tx: AlarmTx) -> Begun:
        state, queue = tx.state, tx.queue
        taken = lease.take(tx, now, fired_for=fired_for)
        if not isinstance(taken, lease.Lease):
            return Begun(taken, state.host)
        active, producing = tx.producing_lanes(now)
        read_current_state(tx, runtime)
        register_framework_lanes(tx, now)
        observed.generation = state.dirty
        retry_at = tx.retry_deadline() or EPOCH
        native = queue.find(NATIVE)
        publication = queue.find(PUBLICATION)
        if active == 0 and native is not None:
            observed.available[NATIVE] = native.revision
        caught_up = Started(False, state.dirty, state.nonterminal, active)

        def quick() -> Begun:
            begun = Begun(taken, state.host, caught_up, queue.read(), producing)
            plan = short_path(begun.rows, producing, now, started_at)
            if plan is None:
                return begun
            if not isinstance(plan, tuple):  # NOTHING
                lease.release_in(state, taken)
                alarm, begun.parked = settle_alarm(tx, observed.generation, None, active, now)
                begun.finished = PassReport(
                    host=state.host.key,
                    phase=PassPhase.CAUGHT_UP.value,
                    nonterminal=caught_up.nonterminal,
                    alarm=alarm,
                    generation=observed.generation,
                    lateness_ms=lateness,
                )
                write_record(state.host, started_at, begun.finished, deadline=deadline)
                return begun
            spec, row = plan
            claimed = charge_in(tx, row, now)
            if claimed is not None:
                begun.wave = (spec, claimed, now)
            return begun

        if (
            state.processed >= state.dirty
            or retry_at > now
            or native is None
            or native.due_at is None
            or native.floor > now
            or (publication is not None and publication.parked)
        ):
            return quick()
        if observed.charged.get(NATIVE) == native.revision:
            charged: Lane | None = native
        else:
            charged = queue.claim(native, now, native=True)
        if charged is None:
            return quick()
        observed.queue[NATIVE] = charged
        observed.charged[NATIVE] = charged.revision
        tx.arm_within_lease(now)
        started = Started(
            True, state.dirty, state.nonterminal, active, charged.revision, charged.stalls
        )
        return Begun(taken, state.host, started, queue.read(), producing)

    begun = run_alarm_transaction(host, "begin maintenance pass", fn)
    if begun.wave is not None:
        observe_claim(observed, begun.wave[1])
    return begun
