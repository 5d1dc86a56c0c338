"""The maintenance pass: one bounded, idempotent run of one host, started by its alarm.

``run_pass(host)`` builds the pass (``Pass``, ``state.py``) and ``begin`` takes
the host's pass lease (a concurrent pass returns ``busy`` at once) and reads what the pass
needs under the host's locks (the O(1) caught-up path makes a constant number of queries);
``run_waves_and_native`` runs the concurrent lane waves beside the native step, then the
after-native waves, and ``finish`` re-arms or clears the slot. Any failure first schedules
bounded, durable recovery (``rearm_failure``) and is then re-raised, so the alarm always stays
armed while work remains.

The phases live beside it: ``ensure.py`` (the registry check, lane registration and parked
notices it shares with ``ensure_alarm``), ``native.py`` (the native step), ``waves.py`` (every
lane wave: a caught-up pass's nothing or one wave, the waves around the native step) and
``finish.py`` (the finish decision, ``rearm_failure``, ``PassReport`` and its row).

Note [Prompt start]
    A producer's commit that leaves work due now sends a hint (Note [Prompt hint] in
    ``mutations/gate.py``); every cluster whose broker runs the host's slot hands its workers
    a ``prompt_pass`` task at once (``durable_agent/broker.py`` ``prompt_tasks``), which runs
    ``run_pass(host, prompt=True)``. Such a pass is an ordinary pass begun by the same
    ``begin``, except that ``take`` ignores the slot (it holds the backstop, armed at the
    minimum delay) and writes nothing when nothing is due (another cluster's prompt pass, or
    the alarm's, got there first: ``stale``) or another pass holds the lease (``busy``, not
    recorded: that pass re-arms the slot when it finishes). The lease decides which of
    several clusters runs it. When a prompt pass takes the lease, its begin moves the slot as
    any begin does, so the backstop does not fire behind it; when the hint is lost (a crash
    after the commit, the listener down, a cluster restarting) the slot fires at its time.

Note [Begin does not wait for the flush]
    A commit on PostgreSQL waits until its WAL is flushed to disk (about a millisecond here):
    a pass that ran a fresh submission waited for two such flushes before the agent's first
    line, its begin's and its head's claim, and a lane wave one before its handler. A begin
    that took the lease commits with ``synchronous_commit`` off (``AlarmTx.commit_unflushed``
    in ``store/transactions.py``): its commit is visible to every other transaction at once,
    as any commit is, and it reaches the disk with the next flush. PostgreSQL flushes the WAL
    in order, so every later commit that waits for its flush makes begin's durable too: the
    head's claim before the agent runs (its attempt must be counted), the agent's or the
    handler's own writes, the settlement. Only a server crash (or a failover)
    can lose begin's commit, within the WAL writer's delay (``wal_writer_delay``, 200 ms by
    default) and only when nothing that waited for its flush committed after it. The
    database then holds the state before begin, which was committed and keeps the invariant
    (the slot armed, the generation unacknowledged). What ran on begin's word alone is a
    lane handler that the crash stopped, or one that ended before it with no write of its
    own; a handler stopped by a crash runs again whether or not its claim survived (lanes
    run at least once). What such a loss forgets is the lane's claim, its no-progress count
    and backoff floor, which the next pass writes again.

    The pass's last transaction commits unflushed too when nothing of the pass it settles
    is kept only there: the ``finish`` that gives the lease back and settles the slot, and
    the native checkpoint that ends the pass. What the pass did is already durable by then:
    a settlement commits flushed (the agent's outcome is in it), a wave's completion too.
    Losing the last transaction to a server crash leaves the state its earlier commits left,
    which keeps the invariant: begin armed the slot within the lease (or, when begin too was
    lost, the state before it, as above), and every producer commit since (the settlement's
    own included) bumped the generation and armed the slot, flushed. What such a loss
    forgets is the pass's acknowledgement, its record, the slot's re-arming and the native
    step's bookkeeping (the round-robin cursor, a native backoff written, binding waits
    dropped): the slot fires by the lease's end, and that pass finds the work done,
    acknowledges it and writes the bookkeeping again (a lost backoff only lets it retry
    sooner). A caught-up wave's completion (``waves.one_wave``) is the only record that its
    handler ran, so it waits for the flush, as the gate's commit, the claim, the settlement,
    a handler's own writes and a failed pass's back-off do.
    Inside a caller's ``transaction.atomic`` the setting would outlive the alarm transaction
    into the caller's, so there these transactions commit as any transaction does; so they
    do on any other database.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from durable_agent import clock, conf, observability
from durable_agent.errors import HostNotFound, PassError, PassFailed, is_stop
from durable_agent.maintenance import failpoints
from durable_agent.maintenance.lane_ids import NATIVE, PUBLICATION
from durable_agent.maintenance.passes.ensure import (
    read_current_state,
    register_framework_lanes,
    report_parked,
)
from durable_agent.maintenance.passes.finish import (
    MAX_PASS_ERROR_LENGTH,
    PassReport,
    check_deadline,
    finish,
    record,
    record_failure,
    record_pass,
    recorded,
    report_of,
)
from durable_agent.maintenance.passes.native import run_native
from durable_agent.maintenance.passes.pool import Executor
from durable_agent.maintenance.passes.state import (
    Busy,
    Lease,
    Pass,
    Stale,
    heartbeat,
    release,
    take,
)
from durable_agent.maintenance.passes.waves import (
    admit_waves,
    after_native,
    join,
    one_wave,
    publication_barrier,
    quick,
    refill_waves,
    validate_lanes,
)
from durable_agent.maintenance.store.transactions import (
    AlarmTx,
    resolve_host_id,
    run_alarm_transaction,
)
from durable_agent.maintenance.types import EPOCH, Lane
from durable_agent.models import Host, PassPhase
from durable_agent.runtime import get_runtime
from durable_agent.text import error_text

logger = logging.getLogger("durable_agent.maintenance")
log_extra = observability.log_extra


def run_pass(
    host: Host | str | int,
    *,
    deadline: datetime | None = None,
    guard: bool = False,
    prompt: bool = False,
) -> PassReport:
    """Run one maintenance pass of ``host`` and record it, in a ``durable_agent.pass`` span.

    Args:
        host: the host (a Host, its key or its id).
        deadline: the alarm deadline this pass was fired for (for the lateness figure).
        guard: apply the early-fire guard (alarm deliveries): a delivery whose slot moved
            later, or with nothing due, returns phase ``stale`` and runs nothing.
        prompt: a prompt start (Note [Prompt start]): with nothing due it returns ``stale``,
            and while another pass holds the lease ``busy``, both without writing anything.

    Raises:
        Whatever failed the pass, after ``rearm_failure`` scheduled durable recovery; a
        failure that is not an ``Exception`` as a :class:`PassError`, unless it is the
        process being stopped (Note [A stop is not a failure] in ``durable_agent/errors.py``).
    """
    return _reported(lambda: _run_pass(host, slot_time=deadline, guard=guard, prompt=prompt))


def run_begun(p: Pass) -> PassReport:
    """Run and record the rest of a pass whose begin already committed (``begin_together`` in
    ``durable_agent/tasks.py``), as :func:`run_pass` runs it after its begin."""
    return _reported(lambda: _after_begin(p))


def _reported(run: Callable[[], PassReport]) -> PassReport:
    with observability.span("durable_agent.pass") as current:
        try:
            report = run()
        except BaseException as exc:
            if isinstance(exc, Exception) or is_stop(exc):
                raise
            raise PassError(error_text(exc, limit=MAX_PASS_ERROR_LENGTH)) from exc
        current.set_attribute("durable_agent.host_key", report.host)
        current.set_attribute("durable_agent.phase", report.phase)
        return report


def _run_pass(
    host: Host | str | int, *, slot_time: datetime | None, guard: bool, prompt: bool = False
) -> PassReport:
    # An id is read by the pass's first transaction (with the lanes), not by a query before it.
    ref = host if isinstance(host, int) and not isinstance(host, bool) else _host(host)
    p = Pass(ref, get_runtime(), clock.now(), slot_time=slot_time, guard=guard, prompt=prompt)
    begin(p)
    return _after_begin(p)


def _after_begin(p: Pass) -> PassReport:
    slot_time, prompt = p.slot_time, p.prompt
    taken = p.lease
    if isinstance(taken, Stale):
        logger.debug(
            "Stale alarm delivery: %s",
            taken.reason,
            extra=log_extra(p.host, phase="stale", action="pass"),
        )
        return PassReport(host=p.host.key, phase="stale", lateness_ms=p.lateness_ms)
    if isinstance(taken, Busy):
        report = PassReport(host=p.host.key, phase=PassPhase.BUSY.value, lateness_ms=p.lateness_ms)
        if not prompt:  # Note [Prompt start]: a hint that finds a pass running writes nothing
            record(p.host, p.started_at, report, deadline=slot_time)
        return report
    assert isinstance(taken, Lease)
    if p.finished:  # Note [Nothing or one wave to run]
        return recorded(p.host, p.started_at, report_of(p, PassPhase.CAUGHT_UP.value), p.parked)
    released = False
    try:
        with heartbeat(taken):
            try:
                failpoints.hit("maintenance:begin:after")
                if p.wave is not None:
                    one_wave(p, taken)
                    released = True
                    report = report_of(p, PassPhase.CAUGHT_UP.value)
                    return recorded(p.host, p.started_at, report, p.parked)
                phase = run_waves_and_native(p)
                finish(p, taken)
                released = True
            except BaseException as exc:
                record_failure(p, exc)
                raise
    finally:
        if not released:
            release(taken)
            report_parked(p.host.pk)
    if p.parked:
        report_parked(p.host.pk)
    report = report_of(p, phase)
    record_pass(p, report, deadline=slot_time)
    return report


def _host(host: Host | str | int) -> Host:
    if isinstance(host, Host) and host.pk is not None:
        return host
    found = Host.objects.filter(pk=resolve_host_id(host, verify=False)).first()
    if found is None:
        raise HostNotFound(f"No host {host!r}", host=host)
    return found


def run_waves_and_native(p: Pass) -> str:
    """The general path: the concurrent waves beside the native step (after the publication
    barrier), one more round of them, then the after-native waves; returns the pass's phase."""
    p.saw(p.rows)
    validate_lanes(p.rows)
    p.executor = Executor(conf.pass_workers())
    failures: list[BaseException] = []
    try:
        waves = admit_waves(p, p.rows, p.producing)
        p.native_only = p.actionable and not waves
        try:
            pending, next_at = publication_barrier(p)
            p.native_runs = p.actionable and not pending
            if pending:
                p.next_at = next_at
            elif p.native_runs:
                run_native(p)
        except BaseException as exc:
            failures.append(exc)
        else:
            p.native_only = False
        failures += join(waves)
        if not failures and p.native_runs:  # Note [Deliver what the pass produced]
            failures += join(refill_waves(p, waves))
        failures += after_native(p)
    finally:
        p.executor.shutdown()
    if failures:
        raise combined(failures)
    check_deadline(p.event_deadline)
    return PassPhase.ACTIONABLE.value if p.actionable else PassPhase.CAUGHT_UP.value


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


def begin(p: Pass, *, join: bool = False) -> None:
    """Take the lease and ``begin_pass`` under the generation snapshot, in one short
    transaction: charge the native lane once (docs/pass.md, step 1). A caught-up pass with
    nothing or one wave to run goes further in the same transaction (Note [Nothing or one
    wave to run]). Everything later phases need of the state row is read here, under the
    host's locks, into ``p``.

    The one place a pass starts: whatever the start (an alarm delivery with the early-fire
    guard, an operator, a prompt start), it is a way into this transaction. With ``join`` it
    runs inside the caller's transaction, without a savepoint (``begin_together``).
    """
    failpoints.hit("maintenance:begin:before")
    now = clock.now()
    fired_for = p.slot_time if p.guard else None

    def fn(tx: AlarmTx) -> None:
        state, queue = tx.state, tx.queue
        p.host = state.host
        p.lease = taken = take(tx, now, fired_for=fired_for, prompt=p.prompt)
        if not isinstance(taken, Lease):
            return
        tx.commit_unflushed()  # Note [Begin does not wait for the flush]
        active, p.producing = tx.producing_lanes(now)
        read_current_state(tx, p.runtime)
        register_framework_lanes(tx, now)
        p.generation = state.dirty
        p.nonterminal = state.nonterminal
        p.active_at_start = active
        p.last_recovered_thread = state.last_recovered_thread
        p.last_served_thread = state.last_served_thread
        p.last_after_native_lane = state.last_after_native_lane
        if queue.stored is not None:  # Note [Begin knows the native step's records]
            p.no_binding_waits = not queue.stored.binding_waits
            p.recovery.none_stored = not queue.stored.faults
        retry_at = tx.retry_deadline() or EPOCH
        native = queue.find(NATIVE)
        publication = queue.find(PUBLICATION)
        if (
            state.processed >= state.dirty
            or retry_at > now
            or native is None
            or native.due_at is None
            or native.floor > now
            or (publication is not None and publication.parked)
        ):
            quick(tx, p, active, now)
            return
        if p.charged.get(NATIVE) == native.revision:
            charged: Lane | None = native
        else:
            charged = queue.claim(native, now, native=True)
        if charged is None:
            quick(tx, p, active, now)
            return
        p.claimed(charged)
        tx.arm_within_lease(now)
        p.actionable = True
        p.source_revision = charged.revision
        p.stalls = charged.stalls
        p.rows = queue.read()

    run_alarm_transaction(p.ref, "begin maintenance pass", fn, join=join)
    if p.wave is not None:
        p.claimed(p.wave[1])
