"""The mutation gate: how producers admit work so that no accepted work is ever lost.

Every actionable mutation advances the host's durable generation and arms its alarm in the same
commit as the source facts (``transaction``), or before its body runs (``mutation``)::

    with gate.transaction(host) as tx:          # the outermost source transaction
        Outbox.objects.create(...)
        tx.schedule("outbox", due_at)           # buffered; flushed just before COMMIT
        tx.record_progress(["outbox"])          # source progress: replenishes the lane

    with gate.mutation(host, lanes=("outbox",)):  # prearmed: generation + alarm commit first
        call_remote_service()

Note [Buffered intent]
    ``gate.transaction`` buffers lane intent in a frame and replays it in one alarm transaction
    right before the source transaction commits, so the host's locks are held only for that
    tail. A nested ``gate.transaction`` is a child frame (a savepoint): its intent merges into
    the parent when it succeeds and is discarded when it fails. A raw ``transaction.atomic``
    between two frames, or around the outermost one, cannot own buffered intent and is refused.
    On PostgreSQL the replay of usual intent is one call of a server-side function
    (``commit_function.py``, Note [The commit function]).

Note [Prompt hint]
    The slot a producer's commit arms is the durable backstop: no sooner than the minimum
    alarm delay (50 ms) ahead. A commit that leaves work due now (source progress, a
    ``schedule`` due at or before now; never maintenance's own ``native_source`` writes) also
    sends a hint on PostgreSQL, ``pg_notify(PROMPT_CHANNEL, '<alarm cluster> <host id>')``, in
    the same transaction (in the commit function's statement, or one statement more on the
    Python path): PostgreSQL delivers it at the commit and drops it with a rollback. The
    broker starts that host's pass at once (Note [Prompt start] in ``passes/run.py``). The
    hint is droppable: lost with a crash after the commit, a listener that is down or a
    cluster restarting, the slot still fires at its time. Upstream's ``schedule_now`` is the
    same rule: a hint with no minimum delay beside the durable alarm (docs/pass.md).

Size: the gate's frames, its replay and its commit path read together.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from django.db import DatabaseError, router
from django.db import transaction as db_transaction

from durable_agent import clock, conf, observability
from durable_agent.errors import GateMisuse, InvalidInput
from durable_agent.maintenance import failpoints, registry
from durable_agent.maintenance.lane_ids import NATIVE, PUBLICATION, validate_lane_id
from durable_agent.maintenance.mutations import commit_function
from durable_agent.maintenance.store.rows import Update
from durable_agent.maintenance.store.transactions import (
    AlarmTx,
    commit_failed,
    no_sooner_than_minimum,
    producing_lanes,
    resolve_host_id,
    run_alarm_transaction,
    user_atomic_depth,
)
from durable_agent.maintenance.types import (
    ProgressOp,
    ScheduleOp,
    validate_cursor,
    validate_deadline,
)
from durable_agent.models import Host, MaintenanceState, MutationTicket

T = TypeVar("T")
HostRef = Host | str | int

# Lanes enrolled by the enclosing gate.mutation blocks, per host id.
_mutation_lanes: contextvars.ContextVar[dict[int, frozenset[str]] | None] = contextvars.ContextVar(
    "durable_agent_mutation_lanes", default=None
)


def _enrolled_lanes() -> dict[int, frozenset[str]]:
    return _mutation_lanes.get() or {}


# True while maintenance itself calls the runtime: such writes do not advance `dirty`.
_native_source: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "durable_agent_native_source", default=False
)
_local = threading.local()


_Op = ScheduleOp | ProgressOp


@dataclass
class _Frame:
    host_id: int
    depth: int
    parent: _Frame | None
    ops: list[_Op] = field(default_factory=list)
    active: bool = True


def _frames() -> list[_Frame]:
    frames: list[_Frame] | None = getattr(_local, "frames", None)
    if frames is None:
        frames = _local.frames = []
    return frames


def _owning_frame(operation: str, message: str) -> _Frame | None:
    """The frame owning the current transaction; None outside every frame; raise if not owned."""
    frames = _frames()
    if not frames:
        return None
    top = frames[-1]
    if top.active and top.depth == user_atomic_depth():
        return top
    raise GateMisuse(operation, message)


class SourceTransaction:
    """The handle ``gate.transaction`` yields: buffers lane intent for its frame."""

    def __init__(self, frame: _Frame) -> None:
        self._frame = frame

    @property
    def host_id(self) -> int:
        return self._frame.host_id

    def _require_owner(self, operation: str, message: str) -> None:
        frames = _frames()
        if not self._frame.active or not frames or frames[-1] is not self._frame:
            raise GateMisuse(operation, message)
        if user_atomic_depth() != self._frame.depth:
            raise GateMisuse(
                "enroll maintenance source",
                "Nested source scheduling requires gate.transaction "
                "(a raw transaction.atomic cannot own maintenance intent)",
            )

    def schedule(self, lane: str, due_at: datetime, progress_cursor: int | None = None) -> None:
        """Enroll ``lane`` for ``due_at``; a strictly increasing cursor is source progress."""
        self._require_owner(
            "enroll maintenance source",
            "tx.schedule must be called inside its own gate.transaction block",
        )
        self._frame.ops.append(_schedule_op(self._frame.host_id, lane, due_at, progress_cursor))

    def record_progress(self, lanes: Iterable[str] = (), *, due_at: datetime | None = None) -> None:
        """Record committed source progress on ``lanes`` (and on the enclosing mutation's).

        ``due_at``: the work it made is due only then (a delayed submission): the lanes are due
        no later than it and the slot is armed for it, not for now; no prompt hint is sent.
        """
        self._require_owner(
            "record source progress",
            "Source progress requires its authoritative transaction: call tx.record_progress "
            "inside its gate.transaction block",
        )
        op = _progress_op(self._frame.host_id, lanes, due_at)
        if op is not None:
            self._frame.ops.append(op)


def _schedule_op(host_id: int, lane: str, due_at: datetime, cursor: int | None) -> ScheduleOp:
    return ScheduleOp(
        host_id=host_id,
        lane=validate_lane_id(lane),
        due_at=validate_deadline(due_at),
        cursor=None if cursor is None else validate_cursor(cursor),
        now=clock.now(),
    )


def _progress_op(
    host_id: int, lanes: Iterable[str], due_at: datetime | None = None
) -> ProgressOp | None:
    if isinstance(lanes, str):
        raise InvalidInput("lanes must be a list of lane ids, not a string", lanes=lanes)
    affected = {validate_lane_id(lane) for lane in lanes}
    affected |= _enrolled_lanes().get(host_id, frozenset())
    if not registry.requires_publication():
        affected.discard(PUBLICATION)
    if PUBLICATION in affected:
        affected.add(NATIVE)
    if not affected:
        return None
    return ProgressOp(
        host_id,
        frozenset(affected),
        clock.now(),
        _native_source.get(),
        None if due_at is None else validate_deadline(due_at),
    )


def _replay(op: _Op, tx: AlarmTx) -> None:
    queue = tx.queue
    if isinstance(op, ScheduleOp):
        if op.cursor is None:
            queue.dirty(op.lane, op.due_at)
        elif queue.progress(op.lane, op.due_at, op.cursor) and op.lane in (NATIVE, PUBLICATION):
            if op.lane == PUBLICATION:
                queue.dirty(NATIVE, op.due_at, progress=True)
            tx.clear_retry()
            tx.state.dirty += 1
        tx.pull_to_earliest(op.now)
        return
    later = op.later
    for lane in sorted(op.lanes):
        queue.dirty(lane, later or op.now, progress=True, keep_earlier=later is not None)
    if NATIVE in op.lanes and (not op.native_source or tx.retrying):
        tx.clear_retry()
        tx.state.dirty += 0 if op.native_source else 1
    tx.checkpoint.earlier(no_sooner_than_minimum(later or op.now, op.now))


def wants_prompt(ops: Iterable[_Op]) -> bool:
    """Whether a commit of ``ops`` leaves work due now (Note [Prompt hint])."""
    for op in ops:
        if isinstance(op, ProgressOp) and not op.native_source and op.later is None:
            return True
        if isinstance(op, ScheduleOp) and op.due_at <= op.now:
            return True
    return False


def _flush(frame: _Frame) -> None:
    by_host: dict[int, list[_Op]] = {}
    for op in frame.ops:
        by_host.setdefault(op.host_id, []).append(op)
    server = commit_function.available()
    for host_id in sorted(by_host):  # one host at a time, in id order
        ops = by_host[host_id]
        hint = commit_function.hints() and wants_prompt(ops)
        intent = commit_function.fold(host_id, list(ops)) if server else None
        if intent is not None:  # Note [The commit function]: one round trip
            commit_function.commit(intent, "commit maintenance source intent", hint=hint)
            continue

        def replay(tx: AlarmTx, ops: list[_Op] = ops, hint: bool = hint) -> None:
            for op in ops:
                _replay(op, tx)
            if hint:
                commit_function.send_hint(tx.host_id)

        # No savepoint: any failure here fails the whole source transaction anyway.
        run_alarm_transaction(host_id, "commit maintenance source intent", replay, join=True)


@contextmanager
def transaction(host: HostRef) -> Iterator[SourceTransaction]:
    """Open the outermost source transaction (or a child frame inside one).

    The yielded handle buffers lane intent; the outermost frame replays it in one alarm
    transaction just before its ``COMMIT``, so facts, generation, lanes and alarm commit
    together. One commit in all. Traced as a ``durable_agent.gate.transaction`` span
    (docs/operations.md).
    """
    with observability.span("durable_agent.gate.transaction") as current, _transaction(host) as tx:
        current.set_attribute("durable_agent.host_id", tx.host_id)
        yield tx


@contextmanager
def _transaction(host: HostRef) -> Iterator[SourceTransaction]:
    host_id = resolve_host_id(host)
    frames = _frames()
    parent = frames[-1] if frames else None
    depth = user_atomic_depth()
    if depth > 0 and (parent is None or parent.depth != depth or not parent.active):
        raise GateMisuse(
            "begin maintenance source transaction",
            "Use gate.transaction at the outermost source transaction: an enclosing raw "
            "transaction.atomic cannot own buffered maintenance intent",
        )
    committing = False
    try:
        with db_transaction.atomic():
            frame = _Frame(host_id=host_id, depth=depth + 1, parent=parent)
            frames.append(frame)
            try:
                yield SourceTransaction(frame)
                if parent is None:
                    _flush(frame)
            finally:
                frame.active = False
                frames.pop()
            committing = parent is None
    except DatabaseError as exc:
        if committing:
            raise commit_failed() from exc
        raise
    if parent is not None:
        parent.ops.extend(frame.ops)


def update_with_progress(host: HostRef, update: Update, lanes: Iterable[str]) -> bool | None:
    """Run ``update`` (one conditional ``UPDATE``, ``rows.update_statement``) and, when it writes
    a row, record source progress on ``lanes`` with it, in one statement that commits by
    itself. True: written, with its progress; False: no row matched, nothing written; None:
    not here (another database, an open transaction, a write routed to a database other than
    the host's state, intent the commit function does not take): the caller runs the write in
    ``gate.transaction`` instead.

    Note [A write and its progress in one statement]
        A ``gate.transaction`` whose body is one conditional ``UPDATE`` followed by
        ``tx.record_progress`` (an attempt's settlement) is four round trips on PostgreSQL:
        ``BEGIN``, the ``UPDATE``, the commit function, ``COMMIT``. Written as one statement
        (``WITH written AS (UPDATE ... RETURNING 1) SELECT durable_agent_commit_intent(...)
        FROM written``) outside any transaction, it is one: the function runs once when the
        ``UPDATE`` wrote its row and not at all when it wrote none, and the statement is its
        own transaction, so the fact, the generation, the lanes and the slot commit together
        (flushed) as before, or not at all. The locks are taken in the same order (the
        written row, then the host's as the function takes them). Inside a transaction (a
        caller's ``atomic``, a ``gate.transaction`` frame) it is not used: the caller's
        intent must be replayed at that transaction's end.
    """
    if not commit_function.available() or _frames() or user_atomic_depth() > 0:
        return None
    if update.using != router.db_for_write(MaintenanceState):  # one statement, one database
        return None
    host_id = resolve_host_id(host)
    op = _progress_op(host_id, lanes)
    intent = None if op is None else commit_function.fold(host_id, [op])
    if op is None or intent is None:
        return None
    hint = wants_prompt([op])
    operation = "commit maintenance source intent"
    # A test case's transaction is kept usable by a savepoint; outside one, none is needed.
    savepoint = (
        db_transaction.atomic()
        if db_transaction.get_connection().in_atomic_block
        else nullcontext()
    )
    with observability.span("durable_agent.gate.transaction") as current, savepoint:
        current.set_attribute("durable_agent.host_id", host_id)
        return commit_function.commit_with_update(intent, update, operation, hint=hint)


def schedule(
    host: HostRef, lane: str, due_at: datetime, progress_cursor: int | None = None
) -> None:
    """Enroll ``lane`` for ``due_at`` without accelerating its retry floor.

    Inside a ``gate.transaction`` block this joins its buffered intent; elsewhere it runs its
    own alarm transaction (inside a raw ``transaction.atomic`` it joins that through a
    savepoint). A strictly increasing ``progress_cursor`` (a committed source fact id, never a
    clock or attempt counter) replenishes the lane's budget; an equal or older one is a replay.
    """
    host_id = resolve_host_id(host)
    op = _schedule_op(host_id, lane, due_at, progress_cursor)
    frame = _owning_frame(
        "enroll maintenance source",
        "Nested source scheduling requires gate.transaction "
        "(a raw transaction.atomic cannot own maintenance intent)",
    )
    if frame is not None:
        frame.ops.append(op)
        return
    hint = commit_function.hints() and wants_prompt([op])

    def replay(tx: AlarmTx) -> None:
        _replay(op, tx)
        if hint:  # Note [Prompt hint]
            commit_function.send_hint(host_id)

    run_alarm_transaction(host_id, "schedule maintenance lane", replay)


def record_progress(host: HostRef, lanes: Iterable[str] = ()) -> None:
    """Module-level ``tx.record_progress`` for the innermost ``gate.transaction`` block."""
    host_id = resolve_host_id(host)
    frames = _frames()
    if not frames or frames[-1].depth != user_atomic_depth():
        raise GateMisuse(
            "record source progress",
            "Source progress requires its authoritative transaction: call it inside "
            "gate.transaction",
        )
    op = _progress_op(host_id, lanes)
    if op is not None:
        frames[-1].ops.append(op)


@contextmanager
def mutation(
    host: HostRef, *, invalidates_recovery: bool = True, lanes: Iterable[str] = ()
) -> Iterator[None]:
    """Prearm a mutation: advance the generation and arm the alarm, commit, then run the body.

    Must run outside any transaction (the prearm must commit first). Two commits in all: the
    prearm, then the body's own. While the body runs a :class:`MutationTicket` keeps the pass
    from acknowledging; it is deleted when the body ends, and expires after
    ``MUTATION_TICKET_TTL_MS`` if the process dies.

    Args:
        host: the host (a Host, its key or its id).
        invalidates_recovery: the mutation is native work (admission, approval, abort...): it
            enrolls the native lane and advances ``dirty``.
        lanes: host lanes the mutation creates work for (crash fallback enrollment).
    """
    if isinstance(lanes, str):
        raise InvalidInput("lanes must be a list of lane ids, not a string", lanes=lanes)
    lane_ids = tuple(dict.fromkeys(validate_lane_id(lane) for lane in lanes))
    if user_atomic_depth() > 0:
        raise GateMisuse(
            "prearm maintenance mutation",
            "Run the mutation outside the source transaction so prearming commits first",
        )
    host_id = resolve_host_id(host)
    failpoints.hit("maintenance:dirty:before")
    ticket_id, enrolled = _prearm(host_id, bool(invalidates_recovery), lane_ids)
    enclosing = _enrolled_lanes()
    token = _mutation_lanes.set(
        {**enclosing, host_id: enclosing.get(host_id, frozenset()) | enrolled}
    )
    try:
        failpoints.hit("maintenance:dirty:after")
        failpoints.hit("maintenance:mutation:armed")
        yield
        native_only = sorted(enrolled & {NATIVE, PUBLICATION})
        if native_only != sorted(enrolled):  # release host lanes; native keeps its guard
            MutationTicket.objects.filter(pk=ticket_id).update(lanes=native_only)
        failpoints.hit("maintenance:mutation:finished")
    finally:
        _mutation_lanes.reset(token)
        _end_mutation(host_id, ticket_id)


def _prearm(
    host_id: int, invalidates_recovery: bool, lanes: tuple[str, ...]
) -> tuple[int, frozenset[str]]:
    now = clock.now()
    native_source = _native_source.get()
    publication = registry.requires_publication()
    enrolled = set(lanes)
    if invalidates_recovery:
        enrolled.add(NATIVE)
        if publication:
            enrolled.add(PUBLICATION)

    def fn(tx: AlarmTx) -> int:
        queue = tx.queue
        ticket = MutationTicket.objects.create(
            host_id=host_id,
            lanes=sorted(enrolled),
            invalidates_recovery=invalidates_recovery,
            created_at=now,
            expires_at=now + conf.mutation_ticket_ttl(),
        )
        tx.queue.tickets = None  # read with the lanes, before this one
        if invalidates_recovery:
            queue.dirty(NATIVE, now)  # enrollment, not progress
            if publication:
                queue.dirty(PUBLICATION, now)
        for lane in lanes:
            queue.dirty(lane, now)  # crash fallback only
        if invalidates_recovery and not native_source:
            tx.state.dirty += 1
        tx.pull_to_earliest(now)
        return int(ticket.pk)

    ticket_id = run_alarm_transaction(host_id, "advance maintenance generation", fn)
    return ticket_id, frozenset(enrolled)


def _end_mutation(host_id: int, ticket_id: int) -> None:
    """Delete the ticket and pull the slot forward to whatever is due (a promptness hint)."""
    now = clock.now()

    def fn(tx: AlarmTx) -> None:
        MutationTicket.objects.filter(pk=ticket_id).delete()
        tx.queue.tickets = None  # read with the lanes, before this delete
        earliest = tx.queue.next()
        if earliest is not None:  # a hint: no minimum delay
            tx.checkpoint.earlier(max(now, earliest))

    run_alarm_transaction(host_id, "finish maintenance mutation", fn)


@contextmanager
def native_source() -> Iterator[None]:
    """Mark writes made by maintenance itself: they do not advance the generation."""
    token = _native_source.set(True)
    try:
        yield
    finally:
        _native_source.reset(token)


def run_as_producer(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in a copy of the current context with :func:`native_source` cleared.

    What it writes through the gate counts as a producer's writes and advances the generation,
    even when called from inside maintenance (an agent run by a pass: Note [Agents run as
    producers] in ``durable_agent/agents/attempts.py``).
    """
    context = contextvars.copy_context()
    context.run(_native_source.set, False)
    return context.run(fn, *args)


def snapshot(host: HostRef, fn: Callable[[int], T]) -> T:
    """Run ``fn(live_ticket_count)`` under the host's generation lock."""

    def run(tx: AlarmTx) -> T:
        return fn(tx.live_ticket_count(clock.now()))

    return run_alarm_transaction(host, "snapshot maintenance generation", run)


def active_lanes(host: HostRef) -> frozenset[str]:
    """The lanes enrolled by live mutation tickets of ``host``."""
    return producing_lanes(resolve_host_id(host, verify=False), clock.now())[1]
