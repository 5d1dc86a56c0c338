"""The alarm transaction's four statements as SQL built once per database, and the slot row.

Note [Reads written once]
    Every alarm transaction (each gate commit, each step of a pass) runs the same statements:
    lock the host's state row, read its lanes with the host and its slot (Note [Read the slot
    after the lock]), then write the changed state fields and each changed lane (a revision
    compare-and-set). Built through the ORM, Django compiled them afresh every time, which
    cost more than running them (``docs/benchmarks.md``, gate overhead). Here their SQL is
    built once per connection (per shape, for writes) from the models' own fields; values go
    in through each field's ``get_db_prep_save``/``get_db_prep_value`` and rows come back
    through each field's database converters, as the ORM does. The statements are the ones
    the ORM issued: the same columns, ``ORDER BY lane``, and ``FOR UPDATE`` (``FOR UPDATE OF``
    the lanes) where the database has row locks. The rows come back through
    ``durable_agent.compiled.Columns``. :func:`update_statement` builds the same write to run
    at once (:func:`run_update`), with ``IS NULL`` conditions besides: the settle of a
    completed attempt (Note [A completed attempt settles in one statement] in
    ``durable_agent/agents/attempts.py``), whose ``QuerySet.update`` cost 0.3 ms more to build
    than to run.

Django internals this module relies on (the part of the package most likely to need care on a
Django upgrade): ``Model._meta.concrete_fields`` / ``db_table`` / ``get_field``,
``Field.get_col`` and ``Col.get_db_converters``, ``connection.ops.get_db_converters`` and
``quote_name``, ``Field.get_db_prep_save`` / ``get_db_prep_value``, ``Model.from_db``, and
``connection.features.has_select_for_update`` / ``has_select_for_update_of``.
tests/maintenance/store/test_rows.py compares every statement built here with what the ORM reads and
writes; ``make test`` runs it on Django 5.2 and 6.1, the two ends of the supported range.

The slot row (at the end): read and write a host's django-q ``Schedule`` (docs/concepts.md).
Its writes run inside an alarm transaction (``transactions.py`` calls :func:`apply_checkpoint`
just before it commits); the services on the slot are in ``alarm.py``.

Size: every statement the alarm transaction builds by hand (its reads, their one call on
PostgreSQL, its writes sent together, the slot row) in one place, which
tests/maintenance/store/test_rows.py and tests/maintenance/store/test_lock_read.py check.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model
from django_q.models import Schedule

from durable_agent import conf
from durable_agent.compiled import Columns, reading
from durable_agent.maintenance.types import Checkpoint, Lane
from durable_agent.models import (
    BindingRetry,
    DueLane,
    Host,
    MaintenanceState,
    MutationTicket,
    RecoveryFault,
)


@dataclass(frozen=True)
class _Reads:
    state: Columns
    lock_state_sql: str
    lane: Columns
    host: Columns
    slot: Columns
    load_sql: str
    # load_sql's last three columns hold the host's tickets and whether it has recovery faults
    # and binding waits, and it takes the host's id four times
    with_tickets: bool


_cache: dict[tuple[str, str], _Reads] = {}


def _column(model: type[Model], name: str | None = None) -> str:
    """The database column of ``model``'s field ``name`` (its primary key by default)."""
    field = model._meta.pk if name is None else model._meta.get_field(name)
    column = getattr(field, "column", None)
    assert isinstance(column, str)
    return column


def _reads(connection: BaseDatabaseWrapper) -> _Reads:
    key = (connection.alias, connection.vendor)
    found = _cache.get(key)
    if found is not None:
        return found
    quote = connection.ops.quote_name
    locks = connection.features.has_select_for_update
    state = Columns.of(MaintenanceState, connection)
    state_table = quote(MaintenanceState._meta.db_table)
    host_id = quote(_column(MaintenanceState, "host"))
    lock_state_sql = (
        f"SELECT {', '.join(state.sql)} FROM {state_table} "
        f"WHERE {state_table}.{host_id} = %s" + (" FOR UPDATE" if locks else "")
    )
    lane, host, slot = (Columns.of(m, connection) for m in (DueLane, Host, Schedule))
    lanes_t, host_t, slot_t = (quote(m._meta.db_table) for m in (DueLane, Host, Schedule))
    lane_host = quote(_column(DueLane, "host"))
    lane_name = quote(_column(DueLane, "lane"))
    host_pk = quote(_column(Host))
    host_alarm = quote(_column(Host, "alarm"))
    slot_pk = quote(_column(Schedule))
    of = " OF " + lanes_t if connection.features.has_select_for_update_of else ""
    columns = lane.sql + host.sql + slot.sql
    with_tickets = connection.vendor == "postgresql"
    if with_tickets:  # Note [The tickets come with the lanes]
        tickets_t = quote(MutationTicket._meta.db_table)
        columns.append(
            f"(SELECT json_agg(json_build_array(t.{quote(_column(MutationTicket, 'lanes'))}, "
            f"t.{quote(_column(MutationTicket, 'expires_at'))})) FROM {tickets_t} t "
            f"WHERE t.{quote(_column(MutationTicket, 'host'))} = %s)"
        )
        for model in (RecoveryFault, BindingRetry):  # Note [Begin knows the native step's records]
            columns.append(
                f"EXISTS (SELECT 1 FROM {quote(model._meta.db_table)} r "
                f"WHERE r.{quote(_column(model, 'host'))} = %s)"
            )
    load_sql = (
        f"SELECT {', '.join(columns)} FROM {lanes_t} "
        f"INNER JOIN {host_t} ON ({lanes_t}.{lane_host} = {host_t}.{host_pk}) "
        f"LEFT OUTER JOIN {slot_t} ON ({host_t}.{host_alarm} = {slot_t}.{slot_pk}) "
        f"WHERE {lanes_t}.{lane_host} = %s ORDER BY {lanes_t}.{lane_name} ASC"
        + (" FOR UPDATE" + of if locks else "")
    )
    reads = _Reads(state, lock_state_sql, lane, host, slot, load_sql, with_tickets)
    _cache[key] = reads
    return reads


def lock_state_row(host_id: int) -> MaintenanceState | None:
    """``SELECT ... FOR UPDATE`` the host's state row; None when it does not exist yet."""
    connection = connections[router.db_for_write(MaintenanceState)]
    reads = _reads(connection)
    with reading(connection) as cursor:
        cursor.execute(reads.lock_state_sql, [host_id])
        row = cursor.fetchone()
    if row is None:
        return None
    state = reads.state.instance(row, connection)
    assert isinstance(state, MaintenanceState)
    return state


_ALARM = Host._meta.get_field("alarm")


#: A host's mutation tickets as the lanes read them: ``(lanes, expires_at)`` each.
Tickets = list[tuple[list[str], datetime]]


class Stored(NamedTuple):
    """Whether the host has any recovery fault and any binding wait, read with its lanes."""

    faults: bool
    binding_waits: bool


class LanesRead(NamedTuple):
    """The host's lanes, the host with its slot, and on PostgreSQL what the same statement
    read besides (None where it was not read: another database, or no lanes)."""

    lanes: list[Lane]
    host: Host | None
    tickets: Tickets | None  # Note [The tickets come with the lanes]
    stored: Stored | None  # Note [Begin knows the native step's records]


def load_lanes(host_id: int) -> tuple[list[Lane], Host | None]:
    """The host's lanes in lane order (locked where the database can), with the host and its
    slot read by the same statement; ``([], None)`` when the host has no lanes."""
    read = load_lanes_and_tickets(host_id)
    return read.lanes, read.host


def load_lanes_and_tickets(host_id: int) -> LanesRead:
    """:func:`load_lanes`, and on PostgreSQL the host's mutation tickets and whether it has
    recovery faults and binding waits, read by the same statement.

    Note [The tickets come with the lanes]
        A pass asks for the host's live mutation tickets in its begin and again when it
        completes (which lanes a producer is writing, how many tickets are live): one query
        each, after the lanes. On PostgreSQL the lanes' statement reads every ticket of the
        host as one more column (a subquery over ``da_ticket_host_expiry``) and the alarm
        transaction answers from them (``AlarmTx.producing_lanes``), judging each ticket's
        expiry at the time asked, as the query did. The read is as fresh as the query was:
        it runs after the state row is locked, and a ticket is created and deleted only in
        an alarm transaction, which waits for that lock; a ticket created or deleted by the
        transaction itself is not in it, so the gate's own ticket writes ask the database.

    Note [Begin knows the native step's records]
        The native step reads the host's recovery faults and binding waits before it
        selects a head: two queries, which for nearly every host find nothing. Only a pass
        creates either (``record_recovery_faults``, ``record_binding_wait``, each under the
        pass lease); operators and the registry's change only delete them. So on PostgreSQL
        the lanes' statement also says whether the host has any of each (two ``EXISTS``
        columns, over each table's host index), and a pass whose begin took the lease and
        found none skips those reads until it records one itself (``Pass.no_binding_waits``,
        ``NativeRecovery.none_stored``). A record deleted after begin read it is read and
        found missing, as before.
    """
    connection = connections[router.db_for_write(DueLane)]
    reads = _reads(connection)
    with reading(connection) as cursor:
        cursor.execute(reads.load_sql, [host_id] * 4 if reads.with_tickets else [host_id])
        rows = cursor.fetchall()
    if not rows:
        return LanesRead([], None, None, None)
    return lanes_read(rows, reads, connection)


def lanes_read(
    rows: Sequence[Sequence[Any]],
    reads: _Reads,
    connection: BaseDatabaseWrapper,
    *,
    lanes: bool = True,
) -> LanesRead:
    """The rows of the lanes' statement (at least one) as a :class:`LanesRead`; ``lanes``
    False: one row whose lane columns are NULL (Note [Lock and read in one call]),
    read as the host and its slot alone."""
    n_lane, n_host = len(reads.lane.attnames), len(reads.host.attnames)
    found = []
    for row in rows if lanes else ():
        values = dict(
            zip(reads.lane.attnames, reads.lane.values(row[:n_lane], connection), strict=True)
        )
        found.append(
            Lane(
                lane=values["lane"],
                revision=values["revision"],
                due_at=values["due_at"],
                stalls=values["stalls"],
                progress_key=values["progress_key"],
                not_before=values["not_before"],
                state=values["state"],
                reported=values["reported"],
            )
        )
    first = rows[0]
    host = reads.host.instance(first[n_lane : n_lane + n_host], connection)
    assert isinstance(host, Host)
    slot_row = first[n_lane + n_host : n_lane + n_host + len(reads.slot.attnames)]
    slot = None if slot_row[0] is None else reads.slot.instance(slot_row, connection)
    _ALARM.set_cached_value(host, slot)
    if not reads.with_tickets or not lanes:
        return LanesRead(found, host, None, None)
    return LanesRead(found, host, _tickets(first[-3]), Stored(bool(first[-2]), bool(first[-1])))


def _tickets(value: Any) -> Tickets:
    """The tickets column of the lanes' statement (``json_agg``: NULL when there are none)."""
    if value is None:
        return []
    pairs = json.loads(value) if isinstance(value, str) else value
    return [(list(lanes), datetime.fromisoformat(expires)) for lanes, expires in pairs]


#: Per shape: the statement, then the fields of its values and of its conditions, in order.
_updates: dict[
    tuple[str, str, type[Model], tuple[str, ...], tuple[str, ...], tuple[str, ...]],
    tuple[str, list[Any], list[Any]],
] = {}

#: What a write's caller does with the number of rows it wrote (a compare-and-set's check).
Then = Callable[[int], None]


def update_where(
    model: type[Model],
    values: dict[str, Any],
    where: dict[str, Any],
    *,
    then: Then | None = None,
) -> None:
    """``UPDATE model SET values WHERE where`` (field names to values, ANDed equalities), then
    ``then(rows written)``. Values are prepared by each field, as ``QuerySet.update`` does;
    the statement is built once per shape (Note [Reads written once]). Inside
    :func:`writes_together` on PostgreSQL the write waits for the block's end (Note [One
    write statement per alarm transaction])."""
    connection = connections[router.db_for_write(model)]
    sql, params = _update(connection, model, values, where, ())
    pending = _pending.writes.get(connection.alias)
    if pending is not None:
        pending.append((sql + " RETURNING 1", "count(*)", params, then))
        return
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        written = int(cursor.rowcount)
    if then is not None:
        then(written)


class Update(NamedTuple):
    """One ``UPDATE`` statement, built by :func:`update_statement`, run by :func:`run_update`."""

    sql: str
    params: list[Any]
    using: str


def update_statement(
    model: type[Model], values: dict[str, Any], where: dict[str, Any], *, null: Sequence[str] = ()
) -> Update:
    """:func:`update_where`'s statement to run at once, with ``null``'s fields ``IS NULL``
    among the conditions."""
    using = router.db_for_write(model)
    return Update(*_update(connections[using], model, values, where, tuple(null)), using)


def run_update(update: Update) -> int:
    """Run ``update`` at once, inside :func:`writes_together` too: the rows written."""
    with connections[update.using].cursor() as cursor:
        cursor.execute(update.sql, update.params)
        return int(cursor.rowcount)


def _update(
    connection: BaseDatabaseWrapper,
    model: type[Model],
    values: dict[str, Any],
    where: dict[str, Any],
    null: tuple[str, ...],
) -> tuple[str, list[Any]]:
    meta = model._meta
    key = (connection.alias, connection.vendor, model, tuple(values), tuple(where), null)
    built = _updates.get(key)
    if built is None:
        quote = connection.ops.quote_name
        assignments = ", ".join(f"{quote(_column(model, name))} = %s" for name in values)
        conditions = [f"{quote(_column(model, name))} = %s" for name in where]
        conditions += [f"{quote(_column(model, name))} IS NULL" for name in null]
        sql = f"UPDATE {quote(meta.db_table)} SET {assignments} WHERE {' AND '.join(conditions)}"
        built = _updates[key] = (
            sql,
            [meta.get_field(name) for name in values],
            [meta.get_field(name) for name in where],
        )
    sql, set_fields, where_fields = built
    params = [
        f.get_db_prep_save(v, connection) for f, v in zip(set_fields, values.values(), strict=True)
    ]
    params += [
        f.get_db_prep_value(v, connection)
        for f, v in zip(where_fields, where.values(), strict=True)
    ]
    return sql, params


_inserts: dict[tuple[str, str, type[Model]], str] = {}


def insert_row(model: type[Model], values: dict[str, Any], *, then: Then | None = None) -> None:
    """``INSERT`` one ``model`` row of ``values`` (field names; every other field its
    default), then ``then(its primary key)``. Inside :func:`writes_together` on PostgreSQL
    the insert waits for the block's end with the other writes; elsewhere it is the ORM's
    ``create``."""
    connection = connections[router.db_for_write(model)]
    pending = _pending.writes.get(connection.alias)
    if pending is None:
        row = model._default_manager.create(**values)
        if then is not None:
            then(int(row.pk))
        return
    meta = model._meta
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    key = (connection.alias, connection.vendor, model)
    sql = _inserts.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        columns = ", ".join(quote(_column(model, f.name)) for f in fields)
        marks = ", ".join(["%s"] * len(fields))
        sql = (
            f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({marks}) "
            f"RETURNING {quote(_column(model))}"
        )
        _inserts[key] = sql
    unknown = set(values) - {n for f in fields for n in (f.name, f.attname)}
    if unknown:
        raise TypeError(f"{model.__name__} has no fields {sorted(unknown)}")
    params = [
        f.get_db_prep_save(
            values[f.attname] if f.attname in values else values.get(f.name, f.get_default()),
            connection,
        )
        for f in fields
    ]
    pending.append((sql, f"min({connection.ops.quote_name(_column(model))})", params, then))


class _Pending(threading.local):
    def __init__(self) -> None:
        # per alias: (statement with its RETURNING, what the answer selects, params, then)
        self.writes: dict[str, list[tuple[str, str, list[Any], Then | None]]] = {}
        # per alias: the writes of the blocks inside a ``writes_gathered`` block
        self.gathered: dict[str, list[tuple[str, str, list[Any], Then | None]]] = {}
        # Note [A group's reads in one call]: host id -> its read, taken once
        self.ahead: dict[int, tuple[MaintenanceState, LanesRead]] = {}


_pending = _Pending()


class Batch:
    """What :func:`writes_together` yields: set ``unflushed`` before the block ends to have
    its statement also turn ``synchronous_commit`` off for the rest of the transaction
    (Note [Begin does not wait for the flush] in ``passes/run.py``; ignored elsewhere
    than on PostgreSQL, and when the block wrote nothing)."""

    unflushed = False


@contextmanager
def writes_together(alias: str) -> Iterator[Batch]:
    """Run the :func:`update_where` and :func:`insert_row` writes of the block as one
    statement at its end, on PostgreSQL (elsewhere each runs at once). A block inside
    another (an alarm transaction inside an alarm transaction) sends its own writes at its
    own end, as each transaction did before.

    Note [One write statement per alarm transaction]
        An alarm transaction ends by writing what its callback changed: the state row, each
        changed lane (a revision compare-and-set) and the slot, one ``UPDATE`` each, and a
        pass's last transaction inserts its ``PassRecord`` before them: three or four round
        trips for a pass's begin or its completion. ``run_alarm_transaction`` runs the
        callback and those writes inside this block, so on PostgreSQL they are sent as one
        statement, each write a data-modifying ``WITH`` query, and the statement answers how
        many rows each ``UPDATE`` wrote and the id each ``INSERT`` gave; every write's
        follow-up (the lane's compare-and-set check, the record history's trim) then runs on
        its own answer, in order, so a lost compare-and-set raises the same
        ``RevisionConflict`` as before. Nothing in a callback reads what these writes change
        (they are its own buffered state), and the writes touch different rows, so the one
        snapshot they share changes nothing; the rows they update are the host's state and
        lanes, already locked by the transaction's first statements, and the slot, which
        every alarm transaction writes last (Note [Lock order]). Any other write (a new
        lane, a new slot, a ticket) runs at once, as before. A block that raises drops its
        pending writes with the transaction they belonged to.
    """
    connection = connections[alias]
    batch = Batch()
    if connection.vendor != "postgresql":
        yield batch
        return
    outer = _pending.writes.get(alias)  # a block inside another: its own writes, at its end
    writes: list[tuple[str, str, list[Any], Then | None]] = []
    _pending.writes[alias] = writes
    try:
        yield batch
    finally:
        if outer is None:
            del _pending.writes[alias]
        else:
            _pending.writes[alias] = outer
    gathered = _pending.gathered.get(alias)
    if gathered is not None and outer is None and not batch.unflushed:
        gathered += writes  # Note [A group's writes in one statement]
        return
    _send(connection, writes, unflushed=batch.unflushed)


def _send(
    connection: BaseDatabaseWrapper,
    writes: list[tuple[str, str, list[Any], Then | None]],
    *,
    unflushed: bool,
) -> None:
    """Run ``writes`` as one statement, then each one's follow-up on its answer, in order."""
    if not writes:
        return
    parts = ", ".join(f"w{i} AS ({write[0]})" for i, write in enumerate(writes))
    answer = ", ".join(f"(SELECT {write[1]} FROM w{i})" for i, write in enumerate(writes))
    if unflushed:
        answer += ", set_config('synchronous_commit', 'off', true)"
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {parts} SELECT {answer}", [p for write in writes for p in write[2]])
        row = cursor.fetchone()
    for (_, _, _, then), value in zip(writes, row[: len(writes)], strict=True):
        if then is not None:
            then(int(value))


@contextmanager
def writes_gathered(alias: str) -> Iterator[None]:
    """Send the writes of every outermost :func:`writes_together` block run within this one as
    one statement at its end, on PostgreSQL (elsewhere each block runs as before).

    Note [A group's writes in one statement]
        A group of hosts begun in one transaction (Note [A delivery's passes begin together]
        in ``durable_agent/tasks.py``) sent each begin's writes (its state row, its lanes, its
        slot, Note [One write statement per alarm transaction]) in a statement of its own.
        Inside this block each begin's writes wait for the block's end and go out together,
        each write still a ``WITH`` query of its own, each follow-up (a lane's
        compare-and-set check, a record's history trim) run on its own answer in the order
        written. Nothing a later begin of the group reads is written by an earlier one (each
        begin reads and writes its own host's rows), so the one snapshot changes nothing a
        begin sees; a begin that asks for its commit not to wait for the flush sends its
        writes at once, as before (the group's transaction decides its flush itself). The
        rows written are the group's hosts' state rows and lanes, which the transaction holds
        already, and their slots; a slot is locked, then, after the other hosts' lanes rather
        than before them, which no transaction can wait on: every transaction that locks a
        host's lanes or writes its slot holds its state row first (Note [Lock order] in
        ``durable_agent/maintenance/store/transactions.py``), and the group holds every one
        of its hosts' state rows from its first statement; the firing and django-q's
        scheduler lock slots alone and wait for no lane or state row. A block that raises
        drops the writes gathered, with the transaction they belonged to.
    """
    if connections[alias].vendor != "postgresql" or alias in _pending.gathered:
        yield
        return
    gathered: list[tuple[str, str, list[Any], Then | None]] = []
    _pending.gathered[alias] = gathered
    try:
        yield
    finally:
        del _pending.gathered[alias]
    _send(connections[alias], gathered, unflushed=False)


def slot_deadline(schedule: Schedule | None) -> datetime | None:
    """The deadline a schedule row holds, or None when it is disarmed or missing."""
    if schedule is None or schedule.repeats == 0:
        return None
    value: datetime = schedule.next_run
    return value


def queued_delivery(schedule: Schedule | None, now: datetime) -> datetime | None:
    """The deadline of the slot's queued delivery (Note [A queued delivery holds the slot]):
    the slot fired (``repeats=0``) with a task that no pass has begun, ``SWEEP_GRACE_MS`` ago
    at most. None otherwise.

    Note [A queued delivery holds the slot]
        Firing a slot disarms it and records its task (``repeats=0``, ``task`` set, ``next_run``
        left at the deadline); the delivery may then wait in the queue, behind a burst for
        seconds. A producer that found the slot disarmed armed it again, and the slot fired
        again while the first delivery still waited: under overload every new submission of
        a queued host added one more delivery. A fired slot whose task is still recorded is
        therefore treated by every alarm transaction as armed at its fired deadline: a
        producer's ``earlier`` keeps it and writes nothing, because the queued delivery's
        pass begins under the host's state lock and so sees whatever the producer committed
        before it. Every pass spends the delivery when it takes the lease
        (``Checkpoint.spend`` in ``state.take``), and every write of the slot clears ``task``:
        from then on the slot is armed or disarmed as the pass decides, the backstop at the
        lease's expiry included. A delivery that never begins (its worker killed, the queue
        lost) stops counting once its deadline is ``SWEEP_GRACE_MS`` old: the next producer
        arms the slot, and the sweep re-arms a host with nothing new (Note [A fired slot is
        not a lost one] in ``durable_agent/tasks.py``, the same grace). The commit function
        applies the same rule (``migrations/sql/0015_commit_intent.sql``), and so does the
        audit, which reports a queued delivery's host as armed at its deadline.
        ``SWEEP_GRACE_MS=0`` turns the rule off.
    """
    if schedule is None or schedule.repeats != 0 or not schedule.task:
        return None
    value: datetime = schedule.next_run
    return value if value > queued_after(now) else None


def queued_after(now: datetime) -> datetime:
    """A fired slot's delivery counts as queued while its deadline is after this time."""
    return now - timedelta(milliseconds=int(conf.get("SWEEP_GRACE_MS")))


def slot_checkpoint(schedule: Schedule | None, now: datetime) -> Checkpoint:
    """The checkpoint of an alarm transaction that found ``schedule``: the time it holds, or
    its queued delivery's deadline (Note [A queued delivery holds the slot])."""
    queued = queued_delivery(schedule, now)
    if queued is not None:
        return Checkpoint(current=queued, queued=True)
    return Checkpoint(current=slot_deadline(schedule))


def apply_checkpoint(host: Host, checkpoint: Checkpoint) -> datetime | None:
    """Write the checkpoint's target to the host's schedule row (inside the alarm transaction).

    Any write clears the slot's ``task``: a queued delivery no longer holds it (Note [A queued
    delivery holds the slot]); a spent one is written even when its target is unchanged."""
    target = checkpoint.target()
    if not checkpoint.spent and (checkpoint.intent is None or target == checkpoint.current):
        return target
    schedule = host.alarm
    if schedule is None:
        if target is None:
            return None
        schedule = Schedule.objects.create(
            name=f"durable_agent:host:{host.pk}",
            func=conf.alarm_task(),
            args=repr(host.pk),
            schedule_type=Schedule.ONCE,
            repeats=1,
            next_run=target,
            intended_date_kwarg="deadline",
            cluster=conf.alarm_cluster(),
        )
        Host.objects.filter(pk=host.pk).update(alarm=schedule)
        host.alarm = schedule
    elif target is None:
        update_where(Schedule, {"repeats": 0, "task": None}, {"id": schedule.pk})
        schedule.repeats, schedule.task = 0, None
    else:
        update_where(
            Schedule, {"next_run": target, "repeats": 1, "task": None}, {"id": schedule.pk}
        )
        schedule.next_run, schedule.repeats, schedule.task = target, 1, None
    checkpoint.current, checkpoint.queued, checkpoint.spent = target, False, False
    return target


# -- the lock and the read in one call (PostgreSQL) ----------------------------------------

logger = logging.getLogger("durable_agent.maintenance")

FUNCTION = "durable_agent_lock_and_read"
CALL = f"SELECT * FROM {FUNCTION}(%s)"


@dataclass(frozen=True)
class _Shape:
    names: tuple[str, ...]  # the result's column names, in order
    n_state: int


_shapes: dict[tuple[str, str], _Shape] = {}
_refused: set[tuple[str, str]] = set()
_checked: set[tuple[str, str]] = set()
_checked_many: set[tuple[str, str]] = set()


def _out_names(connection: BaseDatabaseWrapper) -> list[tuple[str, str]]:
    """The function's result columns: (name, SQL type), in order."""
    out: list[tuple[str, str]] = []
    for prefix, model in (
        ("state", MaintenanceState),
        ("lane", DueLane),
        ("host", Host),
        ("slot", Schedule),
    ):
        for field in model._meta.concrete_fields:
            kind = str(field.cast_db_type(connection))
            kind = "varchar" if kind.startswith("varchar") else kind
            out.append((f"{prefix}__{field.column}", kind))
    out += [("tickets", "json"), ("faults", "boolean"), ("binding_waits", "boolean")]
    return out


def _shape(connection: BaseDatabaseWrapper) -> _Shape:
    key = (connection.alias, connection.vendor)
    found = _shapes.get(key)
    if found is None:
        names = tuple(name for name, _ in _out_names(connection))
        found = _shapes[key] = _Shape(names, len(MaintenanceState._meta.concrete_fields))
    return found


def function_sql(connection: BaseDatabaseWrapper) -> str:
    """The ``CREATE OR REPLACE FUNCTION`` statement for the models as they are (PostgreSQL)."""
    reads = _reads(connection)
    quote = connection.ops.quote_name
    state_t = quote(MaintenanceState._meta.db_table)
    state_host = f"{state_t}.{quote(_column(MaintenanceState, 'host'))}"
    # The lanes' statement with the host's id as the argument, the state row's columns first.
    lanes_t = quote(DueLane._meta.db_table)
    load = reads.load_sql.replace("%s", "p_host")
    select, rest = load.split(f" FROM {lanes_t} ", 1)
    columns = ", ".join(reads.state.sql) + ", " + select.removeprefix("SELECT ")
    joined = (
        f"{state_t} INNER JOIN {lanes_t} "
        f"ON ({lanes_t}.{quote(_column(DueLane, 'host'))} = {state_host}) {rest}"
    )
    # No lanes: the state row with the host and its slot, the lanes' columns NULL.
    host_t, slot_t = (quote(m._meta.db_table) for m in (Host, Schedule))
    nulls = ", ".join(
        f"NULL::{kind}" for name, kind in _out_names(connection) if name.startswith("lane__")
    )
    bare = (
        ", ".join(reads.state.sql)
        + f", {nulls}, "
        + ", ".join(reads.host.sql + reads.slot.sql)
        + ", NULL::json, NULL::boolean, NULL::boolean"
        + f" FROM {state_t} INNER JOIN {host_t} ON ({host_t}.{quote(_column(Host))} = {state_host})"
        + f" LEFT OUTER JOIN {slot_t} ON ({host_t}.{quote(_column(Host, 'alarm'))} = "
        + f"{slot_t}.{quote(_column(Schedule))})"
        + f" WHERE {state_host} = p_host"
    )
    declared = ",\n    ".join(f"{name} {kind}" for name, kind in _out_names(connection))
    return (
        f"CREATE OR REPLACE FUNCTION {FUNCTION}(p_host bigint)\n"
        f"RETURNS TABLE (\n    {declared}\n)\n"
        "LANGUAGE plpgsql VOLATILE AS $fn$\n"
        "BEGIN\n"
        f"    PERFORM 1 FROM {state_t} WHERE {state_host} = p_host FOR UPDATE;\n"
        "    IF NOT FOUND THEN\n"
        "        RETURN;\n"
        "    END IF;\n"
        f"    RETURN QUERY SELECT {columns} FROM {joined};\n"
        "    IF NOT FOUND THEN\n"
        f"        RETURN QUERY SELECT {bare};\n"
        "    END IF;\n"
        "END\n"
        "$fn$;\n"
    )


def usable(connection: BaseDatabaseWrapper) -> bool:
    """Whether this database runs the function (PostgreSQL, and not refused this process)."""
    return (
        connection.vendor == "postgresql" and (connection.alias, connection.vendor) not in _refused
    )


def lock_and_read(host_id: int) -> tuple[MaintenanceState, LanesRead] | None:
    """Lock the host's state row and read its lanes, host and slot, in one call: the state
    row and what :func:`load_lanes_and_tickets` reads. None: not here (another database, or a
    result this process cannot read), or the state row does not exist yet; the caller then
    runs the two statements.

    Note [Lock and read in one call]
        Every alarm transaction starts with the same two statements (Note [Reads written once]):
        lock the host's state row, then read its lanes with the host, its slot and
        (on PostgreSQL) its tickets and stored records. On PostgreSQL both run inside one call of
        the server-side function ``durable_agent_lock_and_read`` (migration 0016, its SQL in
        ``durable_agent/migrations/sql/0016_lock_and_read.sql``): one round trip instead of two,
        which a burst host pays twice (its begin and its finish) and a prompt start once before
        the pass's work. The function runs the same two statements in the same order: it locks
        the state row, then, in a later statement of the function, reads the state row with the
        lanes (``ORDER BY lane``, ``FOR UPDATE OF`` the lanes), the host and its slot. A VOLATILE
        PL/pgSQL function takes a fresh snapshot for each statement, so Note [Read the slot after
        the lock] holds: a transaction that waited for the lock reads what the holder committed
        (tests/maintenance/store/test_slot_after_lock.py waits for a real lock). Lock order is
        Note [Lock order]'s; tests/locks.py counts the call as its two locks.

        Its result has the read's columns: the state row's, then the columns of the lanes'
        statement (:func:`load_lanes_and_tickets`), one row per lane, or one row with the lane's
        columns NULL when the host has no lanes. No row: the state row does not exist yet (a
        first use), and the caller creates it as before. The SQL is generated from the models
        (:func:`function_sql`), so a model change or a django-q version whose ``Schedule``
        differs shows as a difference from the migration's file
        (tests/maintenance/store/test_lock_read.py), to be shipped as a new migration. At run
        time the process checks its first result's column names and every result's count of
        columns; a result other than expected is not read: the process logs it once and goes
        back to the two statements.

        Anywhere but PostgreSQL the two statements run as before.
    """
    if _pending.ahead:
        ahead = _pending.ahead.pop(host_id, None)
        if ahead is not None:
            return ahead
    connection = connections[router.db_for_write(MaintenanceState)]
    if not usable(connection):
        return None
    shape = _shape(connection)
    key = (connection.alias, connection.vendor)
    with reading(connection) as cursor:
        cursor.execute(CALL, [host_id])
        # the names once a process (``description`` builds an object a column), the count always
        names = None if key in _checked else tuple(c.name for c in cursor.description)
        rows = cursor.fetchall()
    if not _readable(key, names, rows, shape.names, _checked):
        return None
    if not rows:
        return None
    return _locked_read(rows, connection, shape)


def _readable(
    key: tuple[str, str],
    names: tuple[str, ...] | None,
    rows: Sequence[Sequence[Any]],
    expected: tuple[str, ...],
    checked: set[tuple[str, str]],
) -> bool:
    """Whether a call's answer has the ``expected`` columns: by name the first time a process
    reads it (``names``; then ``checked``), by count always. Else the process stops calling
    the function (Note [Lock and read in one call]) and logs it once."""
    if names is not None and names == expected:
        checked.add(key)
        return True
    if names is None and not (rows and len(rows[0]) != len(expected)):
        return True
    _refused.add(key)
    logger.error(
        "%s returned columns other than the models' (a migration not applied, or a "
        "django-q version whose Schedule differs): this process locks and reads in two "
        "statements",
        FUNCTION,
    )
    return False


def _locked_read(
    rows: Sequence[Sequence[Any]], connection: BaseDatabaseWrapper, shape: _Shape
) -> tuple[MaintenanceState, LanesRead]:
    """One host's rows of the function's result (at least one) as its state row and read."""
    reads = _reads(connection)
    state = reads.state.instance(rows[0][: shape.n_state], connection)
    assert isinstance(state, MaintenanceState)
    rest = [row[shape.n_state :] for row in rows]
    if rest[0][0] is None:  # no lanes: the host and its slot alone
        return state, lanes_read(rest, reads, connection, lanes=False)
    return state, lanes_read(rest, reads, connection)


#: The function called for several hosts in one statement, one host after another in the
#: order given, each host's rows in the order the function returns them (its ordinality,
#: the result's last column, which :func:`lock_and_read_many` drops).
CALL_MANY = (
    "SELECT f.* FROM unnest(%s::bigint[]) WITH ORDINALITY AS h (id, n) "
    f"CROSS JOIN LATERAL {FUNCTION}(h.id) WITH ORDINALITY AS f ORDER BY h.n, f.ordinality"
)


def lock_and_read_many(host_ids: Sequence[int]) -> dict[int, tuple[MaintenanceState, LanesRead]]:
    """:func:`lock_and_read` for each of ``host_ids``, in the order given, in one call (Note
    [A group's reads in one call]); a host the answer does not hold (no state row yet, or not
    here) is left out, and its transaction calls :func:`lock_and_read` itself.

    Note [A group's reads in one call]
        A group of hosts begun in one transaction (Note [A delivery's passes begin together]
        in ``durable_agent/tasks.py``) locked and read each host in a call of its own. On
        PostgreSQL the group's calls are one statement, a ``LATERAL`` call of the same
        function for each host in ascending id order, and each begin takes its host's part
        of the answer (:func:`read_ahead`) instead of calling: the same locks in the same
        order (each host's state row, which the group holds already, then its lanes), the
        same rows, one round trip for the group. The answer's columns are checked as
        :func:`lock_and_read` checks its own, once a process.
    """
    connection = connections[router.db_for_write(MaintenanceState)]
    if not usable(connection) or not host_ids:
        return {}
    shape = _shape(connection)
    key = (connection.alias, connection.vendor)
    with reading(connection) as cursor:
        cursor.execute(CALL_MANY, [list(host_ids)])
        names = None if key in _checked_many else tuple(c.name for c in cursor.description)
        rows = cursor.fetchall()
    if not _readable(key, names, rows, (*shape.names, "ordinality"), _checked_many):
        return {}
    by_host: dict[int, list[Sequence[Any]]] = {}
    for row in rows:  # the state row's first column is its host
        by_host.setdefault(int(row[0]), []).append(row[:-1])
    return {host: _locked_read(found, connection, shape) for host, found in by_host.items()}


@contextmanager
def read_ahead(found: dict[int, tuple[MaintenanceState, LanesRead]]) -> Iterator[None]:
    """Within the block, :func:`lock_and_read` of a host in ``found`` returns its read once,
    without a call (Note [A group's reads in one call]); what the block leaves unused is
    dropped at its end."""
    _pending.ahead = dict(found)
    try:
        yield
    finally:
        _pending.ahead = {}
