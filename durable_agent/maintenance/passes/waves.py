"""One wave's life, in one module: charge an attempt, run the handler outside every lock,
complete or back off; and the waves of a pass, from its begin to its finish.

Note [Charge before fallible work]
    A wave claims its lane (one stall, a retry floor, the slot re-armed to the earliest lane)
    in its own transaction *before* the handler runs. A crash inside the handler therefore
    leaves the lane due at its floor with an armed slot; the completion is a compare-and-set on
    the revision the wave saw, so a producer that raced it keeps its newer revision due.

The general path, around the native step: the concurrent waves admitted when the pass starts
(``admit_waves``), the publication barrier before the native step (``publication_barrier``), one
more round for the lanes the native step made due (``refill_waves``, Note
[Deliver what the pass produced]) and the after-native waves (``after_native``).

The short paths of a caught-up pass, nothing or one lane wave to run: ``short_path`` says what a
caught-up pass has to run; inside the begin transaction
(``durable_agent/maintenance/passes/run.py``) ``quick`` finishes a pass with nothing to run, or
charges the one wave, which ``one_wave`` runs and completes together with the finish (Note
[Nothing or one wave to run]).

Size: a wave is charged, run and completed here whichever path admitted it; the three paths
share those steps, so they are read together.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timedelta
from typing import Any, TypeGuard

from django.db import router, transaction

from durable_agent import clock, observability
from durable_agent.errors import AlarmError, LaneNotRegistered
from durable_agent.maintenance import backoff, failpoints
from durable_agent.maintenance.lane_ids import NATIVE, PUBLICATION
from durable_agent.maintenance.mutations import gate
from durable_agent.maintenance.passes import lane_registry
from durable_agent.maintenance.passes.ensure import report_parked
from durable_agent.maintenance.passes.finish import (
    PassReport,
    check_deadline,
    record_failure,
    recorded,
    report_of,
    settle_alarm,
    write_record,
)
from durable_agent.maintenance.passes.lane_registry import LaneSpec, handler, step_of
from durable_agent.maintenance.passes.state import Lease, Pass, heartbeat, release, release_in
from durable_agent.maintenance.store.due_queue import DueQueue
from durable_agent.maintenance.store.rows import lock_and_read_many, read_ahead, writes_gathered
from durable_agent.maintenance.store.transactions import (
    AlarmTx,
    no_sooner_than_minimum,
    run_alarm_transaction,
)
from durable_agent.maintenance.types import Lane, LaneContext
from durable_agent.models import MaintenanceState, PassPhase

logger = logging.getLogger("durable_agent.maintenance")
ALLOWANCE_MESSAGE = "The admitted host wave exceeded its allowance; durable work remains pending"


class OverrunFlag(threading.Event):
    """The cancellation flag of a wave the pass runs on its own thread: set by hand, or by
    itself once the clock passes ``limit`` (when a pass running its waves on the pool stops
    waiting for one, see :func:`join`), so ``ctx.cancelled()`` means the same either way."""

    def __init__(self, limit: datetime) -> None:
        super().__init__()
        self._limit = limit

    def is_set(self) -> bool:
        return super().is_set() or clock.now() >= self._limit


def validate_lanes(rows: list[Lane]) -> None:
    """Every due row needs a handler (the native lane is the pass itself) of a phase a step of
    the pass runs (Note [Lane phases] in ``lane_registry.py``)."""
    for row in rows:
        if row.due_at is None or row.lane == NATIVE:
            continue
        spec = handler(row.lane)
        if spec is None:
            raise LaneNotRegistered(
                f"No handler registered for scheduled lane: {row.lane}", lane=row.lane
            )
        if step_of(spec) is None:
            raise LaneNotRegistered(
                f"No step of the pass runs phase {spec.phase!r} of scheduled lane: {row.lane}",
                lane=row.lane,
            )


def run_queued(
    p: Pass,
    row: Lane,
    work: Callable[[], datetime | None],
    *,
    allowance: timedelta | None = None,
) -> tuple[bool, datetime | None]:
    """Charge ``row``, run ``work`` and complete the lane; return (ran, next deadline).

    A failing or overrunning wave is completed with backoff and its error re-raised.
    """
    now = clock.now()

    def charge(tx: AlarmTx) -> Lane | None:
        return charge_in(tx, row, now)

    claimed = run_alarm_transaction(p.host, "charge maintenance attempt", charge)
    if claimed is None:
        return False, None
    p.claimed(claimed)
    outcome, failure = run_claimed(row.lane, work, now, allowance)
    complete_wave(p, claimed, outcome, failure)
    if failure is not None:
        raise failure
    return True, outcome


def charge_in(tx: AlarmTx, row: Lane, now: datetime) -> Lane | None:
    """Claim ``row`` and arm the slot within the lease, inside an alarm transaction (Note
    [Charge before fallible work]); None when the lane moved or is not due."""
    claimed = tx.queue.claim(row, now)
    tx.arm_within_lease(now)
    return claimed


def run_claimed(
    lane: str, work: Callable[[], datetime | None], started: datetime, allowance: timedelta | None
) -> tuple[datetime | None, BaseException | None]:
    """Run a claimed wave's ``work`` outside every lock: (its next deadline, its failure)."""
    try:
        outcome = work()
        if allowance is not None and clock.now() - started > allowance:
            raise AlarmError("host dispatch allowance", ALLOWANCE_MESSAGE, lane=lane)
    except BaseException as exc:
        return None, exc
    return outcome, None


def complete_in(
    queue: DueQueue,
    claimed: Lane,
    outcome: datetime | None,
    failure: BaseException | None,
    producing: frozenset[str],
    jitter: float,
) -> int | None:
    """Complete a claimed wave inside an alarm transaction: its revision afterwards, or None
    when a producer raced it (a live ticket enrolls the lane, or the revision moved)."""
    if claimed.lane in producing:
        return None  # a producer between enrollment and commit: never acknowledge
    current = queue.find(claimed.lane)
    if current is None or current.revision != claimed.revision:
        return None  # a racing producer keeps its newer revision due
    due = (
        clock.now() + timedelta(milliseconds=backoff.backoff_delay_ms(claimed.stalls, jitter))
        if failure is not None
        else outcome
    )
    done = queue.complete(claimed, due)
    return None if done is None else done.revision


def complete_wave(
    p: Pass, claimed: Lane, outcome: datetime | None, failure: BaseException | None
) -> None:
    """Complete a claimed wave in its own alarm transaction (backing it off after a failure)."""
    jitter = clock.random()

    def complete(tx: AlarmTx) -> int | None:
        producing = tx.producing_lanes(clock.now())[1]
        return complete_in(tx.queue, claimed, outcome, failure, producing, jitter)

    run_alarm_transaction(p.host, "complete maintenance wave", complete)


def run_wave(
    p: Pass,
    spec: LaneSpec,
    row: Lane,
    cancelled: threading.Event,
    *,
    after_native: bool = False,
    admitted: Callable[[], None] | None = None,
) -> tuple[bool, datetime | None]:
    """Admit one wave of ``spec`` if it fits before the pass's ``dispatch_end`` (and, beside
    the native step, before its ``yield_at``), then run it.

    ``admitted`` runs once the lane is claimed, before its handler: only a wave that really
    runs is recorded as admitted (the after-native rotation cursor).
    """
    now = clock.now()
    allowance = timedelta(milliseconds=spec.allowance_ms)
    until = p.dispatch_end if after_native else p.yield_at
    if now >= until or now + allowance > p.dispatch_end:
        return False, row.due_at  # not admitted: no claim, no debit
    context = LaneContext(
        host=p.host, lane=spec.lane, deadline=now + allowance, _cancelled=cancelled
    )

    def work() -> datetime | None:
        if admitted is not None:
            admitted()
        return spec.run(context)

    with observability.span(
        "durable_agent.wave", host_key=p.host.key, host_id=p.host.pk, lane=row.lane
    ):
        return run_queued(p, row, work, allowance=allowance)


def join(
    futures: list[tuple[str, Future[Any], threading.Event, float]],
) -> list[BaseException]:
    """Wait for every wave; an overrun cancels it and counts as its failure."""
    failures: list[BaseException] = []
    for lane, future, cancelled, allowance_s in futures:
        try:
            future.result(timeout=allowance_s + 1)
        except FutureTimeout:
            cancelled.set()
            failures.append(AlarmError("host dispatch allowance", ALLOWANCE_MESSAGE, lane=lane))
        except BaseException as exc:
            failures.append(exc)
    return failures


def admissible(rows: list[Lane], producing: frozenset[str], now: datetime) -> list[Lane]:
    """Rows a wave may run for now: due, not being produced, not the native barrier lanes."""
    return [
        row
        for row in rows
        if row.lane not in (NATIVE, PUBLICATION)
        and row.lane not in producing
        and row.due_at is not None
        and row.due_at <= now
    ]


#: A submitted wave: its lane, its future, its cancellation flag and its allowance in seconds.
Wave = tuple[str, Future[Any], threading.Event, float]


def publication_barrier(p: Pass) -> tuple[bool, datetime | None]:
    """Run a due publication wave before the native step (6.4 step 1).

    Returns (pending, the native lane's next time). While publication is still pending or
    parked, the native step waits, and the native lane's next time is the publication lane's
    deadline (no sooner than the minimum alarm delay; none while it is parked) rather than the
    minimum delay, so a pending publication is retried on its own backoff (1 s, 2 s, ... after
    each claim).
    """
    row = next((r for r in p.rows if r.lane == PUBLICATION), None)
    if row is None:
        return False, None
    spec = lane_registry.handler(PUBLICATION)
    if spec is not None and row.due_at is not None and row.due_at <= clock.now():
        run_wave(p, spec, row, threading.Event())
        row = next((Lane.from_model(r) for r in p.host.lanes.filter(lane=PUBLICATION)), row)
    if row.due_at is None and not row.parked:
        return False, None
    if row.parked or row.due_at is None:
        return True, None
    return True, no_sooner_than_minimum(row.due_at, clock.now())


def admit_waves(p: Pass, rows: list[Lane], producing: frozenset[str]) -> list[Wave]:
    """Submit a wave of every due lane of a phase that runs beside the native step."""
    now = clock.now()
    waves = []
    for row in admissible(rows, producing, now):
        spec = lane_registry.handler(row.lane)
        if spec is None or lane_registry.step_of(spec) != lane_registry.BESIDE_NATIVE:
            continue
        waves.append(_submit_wave(p, spec, row))
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


def refill_waves(p: Pass, done: list[Wave]) -> list[Wave]:
    """One more wave for each concurrent lane that became due while the native step ran
    (Note [Deliver what the pass produced])."""
    failed = {
        lane
        for lane, future, _, _ in done
        if not future.done() or future.cancelled() or future.exception() is not None
    }
    if clock.now() >= p.yield_at or p.finished:  # Note [The checkpoint finishes a pass ...]
        return []
    if not done and p.after_checkpoint is not None:
        # Note [What the pass already knows after its agents]: no wave of this pass can have
        # written a lane since the checkpoint's transaction read them.
        rows, producing = p.after_checkpoint
    else:
        rows = [Lane.from_model(r) for r in p.host.lanes.all()]
        producing = frozenset(gate.active_lanes(p.host))
    rows = [r for r in rows if r.lane not in failed]
    return admit_waves(p, rows, producing)


def _submit_wave(
    p: Pass,
    spec: lane_registry.LaneSpec,
    row: Lane,
    *,
    after_native: bool = False,
    admitted: Callable[[], None] | None = None,
) -> Wave:
    assert p.executor is not None
    cancelled = threading.Event()
    future = p.executor.submit(
        observability.in_current_trace(
            lambda: run_wave(p, spec, row, cancelled, after_native=after_native, admitted=admitted)
        )
    )
    return row.lane, future, cancelled, spec.allowance_ms / 1000


def after_native(p: Pass) -> list[BaseException]:
    """After-native waves, round-robin from the lane after the last one admitted.

    They are bounded by ``dispatch_end`` alone, not by the yield point: they run after the
    native step even in a pass that reached its yield point. A lane is stored as the last one
    admitted only once its wave has claimed it, so a lane that did not run never moves the
    rotation on.
    """
    selected = [
        s for s in lane_registry.lanes() if lane_registry.step_of(s) == lane_registry.AFTER_NATIVE
    ]
    if not selected or p.finished:  # Note [The checkpoint finishes a pass ...] in native.py
        return []
    rows = {r.lane: r for r in (Lane.from_model(x) for x in p.host.lanes.all())}
    producing = gate.active_lanes(p.host)
    validate_lanes(list(rows.values()))
    cursor = p.last_after_native_lane
    ordered = sorted(selected, key=lambda s: s.lane)
    index = next((i for i, s in enumerate(ordered) if cursor is None or s.lane > cursor), 0)
    rotated = ordered[index:] + ordered[:index]
    failures: list[BaseException] = []
    for spec in rotated:
        found = rows.get(spec.lane)
        now = clock.now()
        if found is None or found.due_at is None or found.due_at > now or spec.lane in producing:
            continue
        if now + timedelta(milliseconds=spec.allowance_ms) > p.dispatch_end:
            continue

        def admit(lane: str = spec.lane) -> None:
            def fn(tx: AlarmTx) -> None:
                tx.state.last_after_native_lane = lane

            run_alarm_transaction(p.host, "admit after-native wave", fn)
            p.last_after_native_lane = lane

        wave = _submit_wave(p, spec, found, after_native=True, admitted=admit)
        failures += join([wave])
    return failures


# Note [Nothing or one wave to run]
#     Most passes of a busy deployment find the host caught up (no native work) with nothing
#     or one lane wave to run: a duplicate delivery, a host whose slot outlived its work, a
#     host with one due outbox lane, each host of a burst of due lanes. Each transaction is a
#     round trip per statement and a commit, and the pass's total is what a burst of due
#     hosts is drained at, so such a pass does its steps in one transaction, or two, instead
#     of four (begin, the wave's charge, its completion, the finish):
#
#     - nothing to run: the begin transaction (``begin`` in ``passes/run.py``, through
#       ``quick``) also makes the finish decision (re-arm at the earliest lane deadline, or
#       disarm), releases the lease it took and writes the ``PassRecord``, all in one commit,
#       so the slot is written at most once;
#     - one concurrent wave: the begin transaction also charges it (the claim and the slot
#       within the lease, exactly what the wave's own charge transaction does, Note [Charge
#       before fallible work]); the handler then runs on the pass's own thread under the
#       lease's heartbeat, and one transaction (``one_wave``) completes the lane, releases the
#       lease, makes the finish decision and writes the ``PassRecord``. A failing handler is
#       completed with backoff in its own transaction and fails the pass as on the general
#       path (``rearm_failure``).
#
#     Anything else (the native step, a due or parked publication lane, a due lane of another
#     step, several waves, a due lane without a handler, a wave whose allowance would pass the
#     pass's dispatch or yield limit) takes the general path. The failpoints keep their
#     meaning: ``maintenance:begin:before`` before the first transaction,
#     ``maintenance:begin:after`` and ``maintenance:finish:before`` around the handler,
#     ``maintenance:finish:after`` after the last.


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
        assert isinstance(p.lease, Lease)
        release_in(tx.state, p.lease)
        p.alarm, p.parked = settle_alarm(tx, p.generation, None, active, now)
        p.finished = True
        report = report_of(p, PassPhase.CAUGHT_UP.value)
        write_record(tx.host, p.started_at, report, deadline=p.slot_time)
        return
    spec, row = plan
    claimed = charge_in(tx, row, now)
    if claimed is not None:
        p.wave = (spec, claimed, now)


def one_wave(p: Pass, taken: Lease) -> None:
    """Run the wave begin claimed, then complete it and finish the pass in one transaction
    (Note [Nothing or one wave to run])."""
    finish = wave_ran(p, taken)
    failpoints.hit("maintenance:finish:before")
    run_alarm_transaction(p.host, FINISH, finish)


FINISH = "finish maintenance event"


def wave_ran(p: Pass, taken: Lease) -> Callable[[AlarmTx], None]:
    """Run the wave begin claimed; the alarm transaction's callback that completes it and
    finishes the pass. A failing wave is completed with backoff and its error raised."""
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
    jitter = clock.random()

    def fn(tx: AlarmTx) -> None:
        now = clock.now()
        active, producing = tx.producing_lanes(now)
        complete_in(tx.queue, claimed, outcome, None, producing, jitter)
        release_in(tx.state, taken)
        p.alarm, p.parked = settle_alarm(tx, p.generation, None, active, now)
        report = report_of(p, PassPhase.CAUGHT_UP.value)
        write_record(tx.host, p.started_at, report, deadline=p.slot_time)

    return fn


def one_wave_only(p: Pass | None) -> TypeGuard[Pass]:
    """Is ``p`` a begun pass whose lease is taken and whose only work is the one wave its
    begin charged (Note [Nothing or one wave to run])?"""
    return p is not None and isinstance(p.lease, Lease) and p.wave is not None and not p.finished


def run_waves_together(ps: Sequence[Pass]) -> dict[int, PassReport | Exception]:
    """Run the waves of ``ps`` (begun together, each :func:`one_wave_only`) one after the
    other, then complete them and finish their passes in one transaction; each host's
    report, or the error that failed its pass (recorded and backed off, as ``run_begun``
    does), by host id.

    Note [A group's finishes together]
        A burst host's pass is its group's begin, its handler and its finish, an alarm
        transaction of its own (``BEGIN``, the lock and read, one write statement,
        ``COMMIT``, and Django's atomic block around them): about two fifths of a worker's
        time in a burst. The passes of a group begun together (Note [A delivery's passes
        begin together] in ``durable_agent/tasks.py``) whose only work is one lane wave run
        their handlers one after the other, each as ``one_wave`` runs it (its own lease,
        renewed by its heartbeat until its finish; a failing handler's wave completed with
        backoff and its pass failed and recorded at once, as alone), then every finish runs
        in one transaction: the hosts' state rows and lanes locked and read in one call in
        ascending id order (Note [A group's reads in one call] in
        ``durable_agent/maintenance/store/rows.py``), each host's finish (its completion, its
        lease given back, its slot settled, its record) exactly as alone, their writes in one
        statement (Note [A group's writes in one statement], which says why no transaction
        can wait on its order), one commit that waits for its flush (a wave's completion is
        the only record that its handler ran). If that transaction fails, each finish runs
        alone, as before this note, and a finish that fails alone fails its pass alone.

        What it costs: a wave's finish waits for the handlers after it in the group (three at
        most: ``GROUP``), as a host's start already waited for the group's begin; the handlers
        themselves run as soon as before. A crash before the group's commit leaves every
        host of the group as a crash before its own finish does: the lane claimed and due at
        its retry floor, the slot armed within the lease, the handler run again.
    """
    out: dict[int, PassReport | Exception] = {}
    ran: list[tuple[Pass, Lease, Callable[[AlarmTx], None]]] = []
    unreleased: list[Lease] = []
    try:
        with contextlib.ExitStack() as beating:
            for p in ps:
                taken = p.lease
                assert isinstance(taken, Lease)
                unreleased.append(taken)
                beating.enter_context(heartbeat(taken))
                try:
                    with observability.span("durable_agent.pass", host_key=p.host.key):
                        failpoints.hit("maintenance:begin:after")
                        ran.append((p, taken, wave_ran(p, taken)))
                except Exception as exc:
                    record_failure(p, exc)
                    out[p.host.pk] = exc
                except BaseException as exc:
                    record_failure(p, exc)
                    raise
            for _ in ran:
                failpoints.hit("maintenance:finish:before")
            finished = _finish_together(ran, out)
            unreleased = [t for t in unreleased if t.host_id not in finished]
    finally:
        for taken in unreleased:
            release(taken)
            report_parked(taken.host_id)
    for p, _, _ in ran:
        if p.host.pk in finished:
            report = report_of(p, PassPhase.CAUGHT_UP.value)
            out[p.host.pk] = recorded(p.host, p.started_at, report, p.parked)
    return out


def _finish_together(
    ran: list[tuple[Pass, Lease, Callable[[AlarmTx], None]]],
    out: dict[int, PassReport | Exception],
) -> set[int]:
    """The finishes of Note [A group's finishes together]: the host ids finished."""
    if not ran:
        return set()
    alias = router.db_for_write(MaintenanceState)
    ordered = sorted(ran, key=lambda item: item[0].host.pk)
    try:
        with (
            transaction.atomic(using=alias),
            read_ahead(lock_and_read_many([p.host.pk for p, _, _ in ordered])),
            writes_gathered(alias),
        ):
            for p, _, fn in ordered:
                run_alarm_transaction(p.host.pk, FINISH, fn, join=True)
        return {p.host.pk for p, _, _ in ran}
    except Exception:
        logger.warning(
            "Finishing %d passes together failed; each finishes alone", len(ran), exc_info=True
        )
    finished: set[int] = set()
    for p, _, fn in ran:
        try:
            run_alarm_transaction(p.host.pk, FINISH, fn)
        except Exception as exc:
            record_failure(p, exc)
            out[p.host.pk] = exc
        else:
            finished.add(p.host.pk)
    return finished
