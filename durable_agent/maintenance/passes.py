"""The maintenance pass: one bounded, idempotent run of one host, started by its alarm.

``run_pass(host)`` takes the host's pass lease (a concurrent pass returns ``busy`` at once),
begins (the O(1) caught-up path makes a constant number of queries), runs the concurrent lane
waves beside the native step, then the after-native waves, and finishes by re-arming or
clearing the slot. Any failure first schedules bounded, durable recovery (``rearm_failure``)
and is then re-raised, so the alarm always stays armed while work remains.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from durable_agent import clock, conf, observability, signals
from durable_agent.errors import AlarmError, LaneNotRegistered, PassFailed
from durable_agent.maintenance import backoff, failpoints, lane_registry, lease
from durable_agent.maintenance.alarm import Checkpoint, clear_retry, retry_deadline
from durable_agent.maintenance.due_queue import EPOCH, DueQueue, Lane
from durable_agent.maintenance.lane_ids import (
    FRAMEWORK_LANES,
    NATIVE,
    PUBLICATION,
    RECOVERY_EVENTS,
    public_lane_name,
)
from durable_agent.maintenance.lane_registry import LaneContext, LaneSpec
from durable_agent.maintenance.native import NativeResult, NativeStep, Started
from durable_agent.maintenance.transactions import resolve_host_id, run_alarm_transaction
from durable_agent.maintenance.waves import (
    Executor,
    Observation,
    OverrunFlag,
    admissible,
    arm_within_lease,
    charge_in,
    complete_in,
    complete_wave,
    join,
    observe_claim,
    run_claimed,
    run_wave,
    validate_lanes,
)
from durable_agent.models import (
    BindingRetry,
    DueLane,
    Host,
    MaintenanceState,
    MutationTicket,
    PassPhase,
    PassRecord,
)
from durable_agent.runtime import Runtime, get_runtime

logger = logging.getLogger("durable_agent.maintenance")
log_extra = observability.log_extra


def _deadline_message() -> str:
    minutes = conf.event_timeout().total_seconds() / 60
    shown = f"{minutes:g} minute" if minutes >= 1 else f"{conf.event_timeout().total_seconds():g} s"
    return f"The maintenance event exceeded its {shown} deadline; durable recovery remains pending"


@dataclass(frozen=True)
class PassReport:
    """What one pass did.

    ``phase``: ``caught-up`` (no runtime work ran), ``actionable`` (recovery or selection ran)
    or ``busy`` (another pass holds the host). ``alarm``: ``rearmed`` or ``cleared`` (empty
    when busy). ``lateness_ms``: start minus the deadline the alarm fired for.
    """

    host: str
    phase: str
    recovered: int = 0
    settled: int = 0
    nonterminal: int = 0
    alarm: str = ""
    generation: int | None = None
    lateness_ms: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_current_state(state: MaintenanceState, queue: DueQueue, runtime: Runtime) -> None:
    """Apply a binding registry change: clear parked heads and open one native opportunity."""
    key = runtime.binding_registry_key()
    if state.binding_registry_key == key:
        return
    state.binding_registry_key = key
    clear_retry(state)
    BindingRetry.objects.filter(host_id=state.host_id).delete()
    state.dirty += 1
    queue.dirty(NATIVE, EPOCH, progress=True)


def _register_framework_lanes(queue: DueQueue) -> None:
    """Give every framework lane with an installed handler its initial wave."""
    for lane in FRAMEWORK_LANES:
        if lane in (NATIVE, RECOVERY_EVENTS):
            continue
        spec = lane_registry.handler(lane)
        if spec is not None and not lane_registry.is_idle(spec):
            queue.register(lane)


def ensure_alarm(host: Host | str | int) -> datetime | None:
    """The O(1) constructor gate: registry check, lane registration and an armed slot.

    Never scans the ledger. Returns the time the slot holds afterwards.
    """
    host_id = resolve_host_id(host)
    runtime = get_runtime()
    failpoints.hit("maintenance:ensure:before")
    now = clock.now()

    def fn(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> datetime | None:
        read_current_state(state, queue, runtime)
        _register_framework_lanes(queue)
        if state.has_recovery_events and queue.find(RECOVERY_EVENTS) is None:
            queue.dirty(RECOVERY_EVENTS, now)
        if state.dirty > state.processed:
            retry_at = retry_deadline(state)
            native_row = queue.find(NATIVE)
            if retry_at is not None:
                native: datetime | None = retry_at
            elif native_row is not None and native_row.due_at is not None:
                native = native_row.due_at
            else:
                native = now + conf.minimum_alarm_delay()
        else:
            native = None
        queue.checkpoint_native(native)
        earliest = queue.next()
        if earliest is not None:
            checkpoint.earlier(max(now + conf.minimum_alarm_delay(), earliest))
        return checkpoint.target()

    slot = run_alarm_transaction(host_id, "ensure maintenance alarm", fn)
    failpoints.hit("maintenance:ensure:after")
    report_parked(host_id)
    return slot


def report_parked(host_id: int) -> int:
    """Log one notice per newly parked lane (marking it reported); never raises."""
    try:

        def fn(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> list[Lane]:
            return queue.take_parked_reports()

        if not DueLane.objects.filter(host_id=host_id, state="parked", reported=False).exists():
            return 0
        parked = run_alarm_transaction(host_id, "report parked maintenance lanes", fn)
    except Exception:
        logger.exception(
            "Reporting parked maintenance lanes failed",
            extra=log_extra(host_id, action="report_parked"),
        )
        return 0
    for row in parked:
        logger.error(
            "Maintenance lane parked after %d attempts without progress; retrying after %d ms",
            backoff.MAXIMUM_NO_PROGRESS_REARMS,
            backoff.PARKED_RETRY_MS,
            extra=log_extra(
                host_id, lane=public_lane_name(row.lane), lane_id=row.lane, action="lane_parked"
            ),
        )
    _signal_parked(host_id, parked)
    return len(parked)


def _signal_parked(host_id: int, parked: list[Lane]) -> None:
    """``lane_parked`` for each newly parked lane (only when a receiver is connected)."""
    if not parked or not signals.lane_parked.has_listeners(DueLane):
        return
    host = Host.objects.filter(pk=host_id).first()
    for row in parked:
        signals.send_on_commit(
            signals.lane_parked,
            sender=DueLane,
            host=host,
            lane=row.lane,
        )


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
        Whatever failed the pass, after ``rearm_failure`` scheduled durable recovery.
    """
    with observability.span("durable_agent.pass") as current:
        report = _run_pass(host, deadline=deadline, guard=guard)
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
        _record(host_obj, started_at, report, deadline=deadline)
        return report
    if begun.finished is not None:  # Note [Nothing or one wave to run]
        return _recorded(host_obj, started_at, begun.finished, begun.parked)
    released = False
    try:
        with lease.heartbeat(taken):
            try:
                failpoints.hit("maintenance:begin:after")
                if begun.wave is not None:
                    finished, parked = _one_wave(
                        host_obj, started_at, observed, begun, taken, deadline, lateness
                    )
                    released = True
                    return _recorded(host_obj, started_at, finished, parked)
                result, phase, recovered, settled = _run_event(
                    host_obj, started_at, observed, begun
                )
                alarm, parked = _finish(host_obj, observed, result, taken)
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
                _record(host_obj, started_at, failed, deadline=deadline, error=exc)
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
    _record(host_obj, started_at, report, deadline=deadline)
    return report


def _recorded(host: Host, started_at: datetime, report: PassReport, parked: bool) -> PassReport:
    """After a pass whose last transaction also wrote its ``PassRecord``."""
    failpoints.hit("maintenance:finish:after")
    if parked:
        report_parked(host.pk)
    observability.pass_recorded(host, report, started_at=started_at, error=None)
    return report


def _host(host: Host | str | int) -> Host:
    if isinstance(host, Host) and host.pk is not None:
        return host
    found = Host.objects.filter(pk=resolve_host_id(host, verify=False)).first()
    if found is None:
        from durable_agent.errors import HostNotFound

        raise HostNotFound(f"No host {host!r}", host=host)
    return found


def _record(
    host: Host,
    started_at: datetime,
    report: PassReport,
    *,
    deadline: datetime | None,
    error: BaseException | None = None,
) -> None:
    try:
        _write_record(host, started_at, report, deadline=deadline, error=error)
    except Exception:
        logger.exception("Recording a pass failed", extra=log_extra(host, action="record_pass"))
    observability.pass_recorded(host, report, started_at=started_at, error=error)


def _write_record(
    host: Host,
    started_at: datetime,
    report: PassReport,
    *,
    deadline: datetime | None,
    error: BaseException | None = None,
) -> None:
    """Insert the pass's ``PassRecord``; about every 20th pass of a host also prunes its
    history to ``PASS_HISTORY`` rows."""
    record = PassRecord.objects.create(
        host=host,
        started_at=started_at,
        finished_at=clock.now(),
        phase=report.phase,
        recovered=report.recovered,
        settled=report.settled,
        alarm=report.alarm,
        generation=report.generation,
        error="" if error is None else f"{type(error).__name__}: {error}"[:2000],
        deadline=deadline,
        lateness_ms=report.lateness_ms,
    )
    keep = conf.pass_history()
    if record.pk % 20 == host.pk % 20 or keep < 20:  # about every 20th pass of each host
        cutoff = (
            PassRecord.objects.filter(host=host)
            .order_by("-started_at", "-id")
            .values_list("id", flat=True)[keep : keep + 1]
        )
        boundary = list(cutoff)
        if boundary:
            PassRecord.objects.filter(host=host, id__lte=boundary[0]).delete()


def _check_deadline(event_deadline: datetime) -> None:
    if clock.now() >= event_deadline:
        raise AlarmError("maintenance pass deadline", _deadline_message())


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
        waves = _admit_waves(
            host, rows, producing, "concurrent", observed, yield_after, dispatch_until, executor
        )
        native = NativeStep(host, runtime, started, yield_after, executor)
        observed.native_only = started.actionable and not waves
        try:
            pending = _publication_barrier(host, rows, observed, yield_after, dispatch_until)
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
            refill = _refill_waves(host, waves, observed, yield_after, dispatch_until, executor)
            failures += join(refill)
        failures += _after_native(host, observed, yield_after, dispatch_until, executor)
    finally:
        executor.shutdown()
    if failures:
        raise combined(failures)
    _check_deadline(event_deadline)
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


@dataclass
class Begun:
    lease: lease.Lease | lease.Busy | lease.Stale
    host: Host
    started: Started | None = None
    rows: list[Lane] = field(default_factory=list)
    producing: frozenset[str] = frozenset()
    # Note [Nothing or one wave to run]: the one wave begin claimed, or the report of a pass
    # begin already finished (and whether a parked lane waits for its notice).
    wave: tuple[LaneSpec, Lane, datetime] | None = None
    finished: PassReport | None = None
    parked: bool = False


@dataclass(frozen=True)
class PublicationPending:
    """The publication lane still owes work: the native step waits until ``next_at``."""

    next_at: datetime | None


def _publication_barrier(
    host: Host,
    rows: list[Lane],
    observed: Observation,
    until: datetime,
    dispatch_end: datetime,
) -> PublicationPending | None:
    """Run a due publication wave before the native step (6.4 step 1).

    Returns None when publication is idle. While it is still pending or parked, the native
    step waits, and the native lane's next time is the publication lane's deadline (no sooner
    than the minimum alarm delay; none while it is parked) rather than the minimum delay, so
    a pending publication is retried on its own backoff (1 s, 2 s, ... after each claim).
    """
    row = next((r for r in rows if r.lane == PUBLICATION), None)
    if row is None:
        return None
    spec = lane_registry.handler(PUBLICATION)
    if spec is not None and row.due_at is not None and row.due_at <= clock.now():
        run_wave(host, spec, row, observed, until, dispatch_end, threading.Event())
        row = next((Lane.from_model(r) for r in host.lanes.filter(lane=PUBLICATION)), row)
    if row.due_at is None and not row.parked:
        return None
    if row.parked or row.due_at is None:
        return PublicationPending(None)
    return PublicationPending(max(clock.now() + conf.minimum_alarm_delay(), row.due_at))


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

    def fn(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> Begun:
        taken = lease.take(state, queue, checkpoint, now, fired_for=fired_for)
        if not isinstance(taken, lease.Lease):
            return Begun(taken, state.host)
        tickets = list(
            MutationTicket.objects.filter(host_id=state.host_id)
            .live(now=now)
            .values_list("lanes", flat=True)
        )
        active = len(tickets)
        producing = frozenset(lane for lanes in tickets for lane in lanes)
        read_current_state(state, queue, runtime)
        _register_framework_lanes(queue)
        if state.has_recovery_events and queue.find(RECOVERY_EVENTS) is None:
            queue.dirty(RECOVERY_EVENTS, now)
        observed.generation = state.dirty
        retry_at = retry_deadline(state) or EPOCH
        native = queue.find(NATIVE)
        publication = queue.find(PUBLICATION)
        if active == 0 and native is not None:
            observed.available[NATIVE] = native.revision
        caught_up = Started(False, state.dirty, state.nonterminal, active)

        def quick() -> Begun:
            begun = Begun(taken, state.host, caught_up, queue.read(), producing)
            plan = _plan(begun.rows, producing, now, started_at)
            if plan is None:
                return begun
            if not isinstance(plan, tuple):  # NOTHING
                lease.release_in(state, taken)
                alarm, begun.parked = _settle_alarm(
                    state, queue, checkpoint, observed.generation, None, active, now
                )
                begun.finished = PassReport(
                    host=state.host.key,
                    phase=PassPhase.CAUGHT_UP.value,
                    nonterminal=caught_up.nonterminal,
                    alarm=alarm,
                    generation=observed.generation,
                    lateness_ms=lateness,
                )
                _write_record(state.host, started_at, begun.finished, deadline=deadline)
                return begun
            spec, row = plan
            claimed = charge_in(state, queue, checkpoint, row, now)
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
        arm_within_lease(state, queue, checkpoint, now)
        started = Started(
            True, state.dirty, state.nonterminal, active, charged.revision, charged.stalls
        )
        return Begun(taken, state.host, started, queue.read(), producing)

    begun = run_alarm_transaction(host, "begin maintenance pass", fn)
    if begun.wave is not None:
        observe_claim(observed, begun.wave[1])
    return begun


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


def _plan(
    rows: list[Lane], producing: frozenset[str], now: datetime, started_at: datetime
) -> str | tuple[LaneSpec, Lane] | None:
    """What a caught-up pass has to run: ``NOTHING``, one concurrent wave, or None for the
    general path (Note [Nothing or one wave to run])."""
    try:
        validate_lanes(rows)
    except LaneNotRegistered:
        return None  # the general path fails the pass
    by_lane = {row.lane: row for row in rows}
    publication = by_lane.get(PUBLICATION)
    if publication is not None and (publication.due_at is not None or publication.parked):
        return None  # the publication barrier
    for registered in lane_registry.lanes():
        found = by_lane.get(registered.lane)
        if (
            registered.phase == "after-native"
            and found is not None
            and found.due_at is not None
            and found.due_at <= now
            and registered.lane not in producing
        ):
            return None
    waves: list[tuple[LaneSpec, Lane]] = []
    for row in admissible(rows, producing, now):
        found_spec = lane_registry.handler(row.lane)
        if found_spec is not None and found_spec.phase == "concurrent":
            waves.append((found_spec, row))
    if not waves:
        return NOTHING
    if len(waves) > 1:
        return None
    spec, row = waves[0]
    allowance = timedelta(milliseconds=spec.allowance_ms)
    if now >= started_at + conf.yield_after() or now + allowance > started_at + (
        conf.dispatch_until()
    ):
        return None
    return spec, row


def _one_wave(
    host: Host,
    started_at: datetime,
    observed: Observation,
    begun: Begun,
    taken: lease.Lease,
    deadline: datetime | None,
    lateness: int | None,
) -> tuple[PassReport, bool]:
    """Run the wave begin claimed, then complete it and finish the pass in one transaction
    (Note [Nothing or one wave to run])."""
    assert begun.wave is not None
    assert begun.started is not None
    spec, claimed, charged_at = begun.wave
    for row in begun.rows:
        observed.queue.setdefault(row.lane, row)
        if row.lane not in begun.producing:
            observed.available.setdefault(row.lane, row.revision)
    allowance = timedelta(milliseconds=spec.allowance_ms)
    context = LaneContext(
        host=host,
        lane=spec.lane,
        deadline=charged_at + allowance,
        _cancelled=OverrunFlag(charged_at + allowance + timedelta(seconds=1)),
    )
    with observability.span(
        "durable_agent.wave", host_key=host.key, host_id=host.pk, lane=spec.lane
    ):
        outcome, failure = run_claimed(spec.lane, lambda: spec.run(context), charged_at, allowance)
    if failure is not None:
        complete_wave(host, claimed, None, failure, observed)
        raise failure
    _check_deadline(started_at + conf.event_timeout())
    failpoints.hit("maintenance:finish:before")
    jitter = clock.random()
    nonterminal = begun.started.nonterminal

    def fn(
        state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint
    ) -> tuple[int | None, PassReport, bool]:
        now = clock.now()
        tickets = list(
            MutationTicket.objects.filter(host_id=state.host_id)
            .live(now=now)
            .values_list("lanes", flat=True)
        )
        producing = frozenset(lane for lanes in tickets for lane in lanes)
        revision = complete_in(queue, claimed, outcome, None, producing, jitter)
        lease.release_in(state, taken)
        alarm, parked = _settle_alarm(
            state, queue, checkpoint, observed.generation, None, len(tickets), now
        )
        report = PassReport(
            host=host.key,
            phase=PassPhase.CAUGHT_UP.value,
            nonterminal=nonterminal,
            alarm=alarm,
            generation=observed.generation,
            lateness_ms=lateness,
        )
        _write_record(state.host, started_at, report, deadline=deadline)
        return revision, report, parked

    revision, report, parked = run_alarm_transaction(host, "finish maintenance event", fn)
    if revision is not None:
        with observed.lock:
            observed.available[claimed.lane] = revision
    return report, parked


def _admit_waves(
    host: Host,
    rows: list[Lane],
    producing: frozenset[str],
    phase: str,
    observed: Observation,
    until: datetime,
    dispatch_end: datetime,
    executor: Executor,
) -> list[tuple[str, Future[Any], threading.Event, float]]:
    now = clock.now()
    waves = []
    for row in admissible(rows, producing, now):
        spec = lane_registry.handler(row.lane)
        if spec is None or spec.phase != phase:
            continue
        waves.append(_submit_wave(executor, host, spec, row, observed, until, dispatch_end))
    return waves


# Note [Deliver what the pass produced]
#     Upstream's scheduling loop starts another wave of a concurrent lane whenever its last one
#     ended and the lane is due again, until the yield point. The port admits its concurrent
#     waves when the pass starts, so work the native step produced (the ``cleared`` recovery
#     event of a fault it just cleared, say) would wait for the next pass and keep the alarm
#     armed. So once the native step and the first waves have ended, every concurrent lane that
#     is due again gets one more wave, unless its first wave failed in this pass. One round:
#     a lane's claim sets a retry floor, so only new source progress makes it due again. Only
#     after a native step that ran: a caught-up pass produced nothing and keeps its constant
#     number of queries.


def _refill_waves(
    host: Host,
    done: list[tuple[str, Future[Any], threading.Event, float]],
    observed: Observation,
    until: datetime,
    dispatch_end: datetime,
    executor: Executor,
) -> list[tuple[str, Future[Any], threading.Event, float]]:
    """One more wave for each concurrent lane that became due while the native step ran
    (Note [Deliver what the pass produced])."""
    from durable_agent.maintenance import gate

    failed = {
        lane
        for lane, future, _, _ in done
        if not future.done() or future.cancelled() or future.exception() is not None
    }
    if clock.now() >= until:
        return []
    rows = [Lane.from_model(r) for r in host.lanes.all()]
    rows = [r for r in rows if r.lane not in failed]
    producing = frozenset(gate.active_lanes(host))
    return _admit_waves(
        host, rows, producing, "concurrent", observed, until, dispatch_end, executor
    )


def _submit_wave(
    executor: Executor,
    host: Host,
    spec: lane_registry.LaneSpec,
    row: Lane,
    observed: Observation,
    until: datetime,
    dispatch_end: datetime,
    *,
    admitted: Callable[[], None] | None = None,
) -> tuple[str, Future[Any], threading.Event, float]:
    cancelled = threading.Event()
    future = executor.submit(
        observability.in_current_trace(
            lambda: run_wave(
                host, spec, row, observed, until, dispatch_end, cancelled, admitted=admitted
            )
        )
    )
    return row.lane, future, cancelled, spec.allowance_ms / 1000


def _after_native(
    host: Host,
    observed: Observation,
    until: datetime,
    dispatch_end: datetime,
    executor: Executor,
) -> list[BaseException]:
    """After-native waves, round-robin from the lane after the last one admitted.

    They are bounded by ``dispatch_end`` alone, not by the yield point: they run after the
    native step even in a pass that reached its yield point. A lane is stored as the last one
    admitted only once its wave has claimed it, so a lane that did not run never moves the
    rotation on.
    """
    from durable_agent.maintenance import gate

    selected = [s for s in lane_registry.lanes() if s.phase == "after-native"]
    if not selected:
        return []
    rows = {r.lane: r for r in (Lane.from_model(x) for x in host.lanes.all())}
    producing = gate.active_lanes(host)
    for row in rows.values():
        if row.lane not in producing:
            observed.available[row.lane] = row.revision
    validate_lanes(list(rows.values()))
    cursor = MaintenanceState.objects.get(host_id=host.pk).last_after_native_lane
    ordered = sorted(selected, key=lambda s: s.lane)
    index = next((i for i, s in enumerate(ordered) if cursor is None or s.lane > cursor), 0)
    rotated = ordered[index:] + ordered[:index]
    failures: list[BaseException] = []
    for spec in rotated:
        found = rows.get(spec.lane)
        now = clock.now()
        if found is None or found.due_at is None or found.due_at > now or spec.lane in producing:
            continue
        if now + timedelta(milliseconds=spec.allowance_ms) > dispatch_end:
            continue

        def admit(lane: str = spec.lane) -> None:
            def fn(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> None:
                state.last_after_native_lane = lane

            run_alarm_transaction(host, "admit after-native wave", fn)

        wave = _submit_wave(
            executor, host, spec, found, observed, dispatch_end, dispatch_end, admitted=admit
        )
        failures += join([wave])
    return failures


def _finish(
    host: Host, observed: Observation, result: NativeResult, taken: lease.Lease
) -> tuple[str, bool]:
    """The final alarm decision: rearm at the earliest lane, or clear (docs/pass.md, step 4).

    Also gives the lease back, and says whether a lane waits for its parked notice.
    """
    failpoints.hit("maintenance:finish:before")

    def fn(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> tuple[str, bool]:
        lease.release_in(state, taken)
        now = clock.now()
        active = MutationTicket.objects.filter(host_id=state.host_id).live(now=now).count()
        return _settle_alarm(
            state, queue, checkpoint, observed.generation, result.next_at, active, now
        )

    disposition = run_alarm_transaction(host, "finish maintenance event", fn)
    failpoints.hit("maintenance:finish:after")
    return disposition


def _settle_alarm(
    state: MaintenanceState,
    queue: DueQueue,
    checkpoint: Checkpoint,
    generation: int | None,
    next_at: datetime | None,
    active: int,
    now: datetime,
) -> tuple[str, bool]:
    """The finish decision inside an alarm transaction: ``rearmed`` or ``cleared``, and whether
    a parked lane waits for its notice (docs/pass.md, step 4)."""
    parked = any(row.parked and not row.reported for row in queue.read())
    delay = conf.minimum_alarm_delay()
    if active > 0 or state.dirty > state.processed:
        retry_at = retry_deadline(state)
        if retry_at is not None and active == 0:
            native: datetime | None = max(now + delay, retry_at)
        elif state.dirty == generation and active == 0:
            native = next_at or now + delay
        else:
            native = now + delay
    else:
        native = None
    queue.checkpoint_native(native)
    earliest = queue.next()
    if earliest is not None:
        checkpoint.at(max(now + delay, earliest))
        return "rearmed", parked
    checkpoint.cancel()
    return "cleared", parked


def rearm_failure(host: Host, observed: Observation) -> None:
    """Failures durably schedule bounded recovery (docs/pass.md, failures)."""
    generation, native_only = observed.generation, observed.native_only
    if generation is None:
        return  # failed before begin_pass read anything
    failpoints.hit("maintenance:retry:before")
    now = clock.now()
    jitter = clock.random()
    delay = conf.minimum_alarm_delay()

    def fn(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> None:
        active = MutationTicket.objects.filter(host_id=state.host_id).live(now=now).count()
        matches = state.retry_generation is not None and state.retry_generation == generation
        if matches and state.retry_native_only:
            pass  # a native-only retry is kept unchanged
        else:
            previous = matches and bool(state.retry_native_only) == native_only
            prev_stalls = (state.retry_stalls or 0) if previous else 0
            prev_floor = state.retry_not_before if previous else None
            floor = now + timedelta(milliseconds=backoff.backoff_delay_ms(prev_stalls, jitter))
            state.retry_generation = generation
            state.retry_not_before = max(prev_floor or floor, floor)
            state.retry_native_only = native_only
            state.retry_stalls = min(backoff.MAX_RETRY_STALLS, prev_stalls + 1)
        native_deadline = state.retry_not_before or now + delay
        if active > 0 or state.dirty != generation:
            native_deadline = now + delay
        queue.checkpoint_native(
            native_deadline if (state.dirty > state.processed or active > 0) else None
        )
        for lane, row in list(observed.queue.items()):
            if lane == NATIVE:
                continue
            current = queue.find(lane)
            if current is None or row.due_at is None or row.due_at > now:
                continue
            charged = row if observed.charged.get(lane) == row.revision else queue.claim(row, now)
            if charged is not None:
                queue.complete(
                    charged,
                    now + timedelta(milliseconds=backoff.backoff_delay_ms(charged.stalls, jitter)),
                )
        earliest = queue.next()
        if earliest is None:
            checkpoint.cancel()
        else:
            checkpoint.at(max(now + delay, earliest))

    run_alarm_transaction(host, "back off failed maintenance", fn)
    failpoints.hit("maintenance:retry:after")
