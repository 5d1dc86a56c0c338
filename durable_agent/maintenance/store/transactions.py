"""Alarm transactions: facts, lanes and the alarm slot commit or roll back together.

Note [Lock order]
    Every alarm transaction locks the host's maintenance state row first, then its lanes, then
    writes the schedule row. Nothing else takes these locks in another order, and one alarm
    transaction touches exactly one host, so alarm transactions cannot deadlock each other or
    django-q's scheduler (which locks only schedule rows). A gate frame or a delivery's begins
    (Note [A delivery's passes begin together] in ``durable_agent/tasks.py``) carrying several
    hosts take them one after another in ascending id order.

Note [Lock one table]
    Every row lock names the one table it means. On PostgreSQL, ``FOR UPDATE`` without ``OF``
    locks a row of every table in the ``FROM`` clause, and the ORM adds joins behind one's
    back: ``.first()`` orders by the model's default ``ordering``, which for a submission
    joins its thread and host, so ``select_for_update().filter(...).first()`` also locked the
    host row, ahead of the state row, and deadlocked against a commit's foreign-key check
    (``FOR KEY SHARE`` on that host row). So locks are ``select_for_update(of=("self",))``
    with ``.get()`` (which drops the ordering) or an explicit single-table ``order_by``, and
    the SQL written by hand in ``rows.py`` locks one table. tests/test_locks.py captures every
    ``FOR UPDATE`` the suite issues and fails on one that locks a table it did not name, or
    that takes its tables out of the order of Note [Lock order] and Note [Ledger lock order].
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, router, transaction

from durable_agent import clock, conf
from durable_agent.errors import (
    AlarmError,
    DurableAgentError,
    HostNotFound,
    error_message,
    type_name,
)
from durable_agent.maintenance import backoff
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.maintenance.store.due_queue import DueQueue
from durable_agent.maintenance.store.rows import (
    apply_checkpoint,
    lock_and_read,
    lock_state_row,
    slot_checkpoint,
    update_where,
    writes_together,
)
from durable_agent.maintenance.types import Checkpoint
from durable_agent.models import Host, MaintenanceState, MutationTicket
from durable_agent.text import storable, unstorable

logger = logging.getLogger("durable_agent.maintenance")

T = TypeVar("T")

_STATE_FIELDS = [
    f.attname
    for f in MaintenanceState._meta.concrete_fields
    if f.attname not in ("host_id", "updated_at")
]
_local = threading.local()


def no_sooner_than_minimum(when: datetime, now: datetime) -> datetime:
    """A slot time: ``when``, but never sooner than the minimum alarm delay after ``now``."""
    return max(now + conf.minimum_alarm_delay(), when)


def live_ticket_count(host_id: int, now: datetime) -> int:
    """How many mutation tickets of the host are live at ``now``."""
    return MutationTicket.objects.filter(host_id=host_id).live(now=now).count()


def producing_lanes(host_id: int, now: datetime) -> tuple[int, frozenset[str]]:
    """The live mutation tickets of the host (one query): their count, and the lanes they
    enroll (a producer is writing them: no wave may acknowledge them)."""
    tickets = list(
        MutationTicket.objects.filter(host_id=host_id).live(now=now).values_list("lanes", flat=True)
    )
    return len(tickets), frozenset(lane for lanes in tickets for lane in lanes)


class AlarmTx:
    """The handle an alarm transaction hands its callback: the host's locked state row
    (``state``), its lanes (``queue``) and the slot intent (``checkpoint``), with the rules
    every alarm transaction shares: the live mutation tickets, arming the slot at the earliest
    lane deadline (never sooner than the minimum delay), and the durable native backoff (the
    four ``retry_*`` fields, written, cleared and read only here).
    """

    def __init__(
        self,
        host_id: int,
        operation: str,
        state: MaintenanceState,
        queue: DueQueue,
        checkpoint: Checkpoint,
    ) -> None:
        self.host_id = host_id
        self.operation = operation
        self.state = state
        self.queue = queue
        self.checkpoint = checkpoint
        self.unflushed = False

    @property
    def host(self) -> Host:
        return self.state.host

    def commit_unflushed(self) -> None:
        """Commit this transaction without waiting for its WAL flush (Note [Begin does not
        wait for the flush] in ``passes/run.py``): only where the transaction is the outermost
        one, on PostgreSQL, and only for a transaction whose every later effect that matters
        waits for a flush of its own."""
        self.unflushed = True

    # -- live mutation tickets -------------------------------------------------------------

    def live_ticket_count(self, now: datetime) -> int:
        return self.producing_lanes(now)[0]

    def producing_lanes(self, now: datetime) -> tuple[int, frozenset[str]]:
        """:func:`producing_lanes`, from the tickets read with the lanes where they were
        (Note [The tickets come with the lanes] in ``rows.py``)."""
        tickets = self.queue.tickets
        if tickets is None:
            return producing_lanes(self.host_id, now)
        live = [lanes for lanes, expires_at in tickets if expires_at > now]
        return len(live), frozenset(lane for lanes in live for lane in lanes)

    # -- the slot --------------------------------------------------------------------------

    def earliest_slot(self, now: datetime) -> datetime | None:
        """The earliest lane deadline, never sooner than the minimum delay (None: all idle)."""
        earliest = self.queue.next()
        return None if earliest is None else no_sooner_than_minimum(earliest, now)

    def arm_at_earliest(self, now: datetime) -> datetime | None:
        """Set the slot to :meth:`earliest_slot`, or disarm it when every lane is idle."""
        target = self.earliest_slot(now)
        if target is None:
            self.checkpoint.cancel()
        else:
            self.checkpoint.at(target)
        return target

    def pull_to_earliest(self, now: datetime) -> None:
        """Arm the slot at :meth:`earliest_slot` unless it already holds an earlier time."""
        target = self.earliest_slot(now)
        if target is not None:
            self.checkpoint.earlier(target)

    def arm_within_lease(self, now: datetime) -> None:
        """:meth:`arm_at_earliest`, but while a pass lease is live no later than its expiry: a
        pass that dies mid-way is retried within the lease TTL (docs/pass.md)."""
        target = self.earliest_slot(now)
        lease_end = self.state.pass_lease_expires_at
        if self.state.pass_lease_owner and lease_end is not None and lease_end > now:
            target = lease_end if target is None else min(target, lease_end)
        if target is None:
            self.checkpoint.cancel()
        else:
            self.checkpoint.at(target)

    def keep_armed(self) -> None:
        """Note [No dirty host without an alarm]
        Whatever the callback did, a transaction that leaves the host dirty or any lane with a
        deadline never leaves the slot disarmed: it arms it at the earliest lane deadline (never
        sooner than the minimum delay). Correct callers never need this; it keeps the invariant
        true for every other path (a first use that only reads, a helper that forgot its intent).
        """
        if self.checkpoint.target() is not None:
            return
        earliest = self.queue.next()
        if earliest is None and self.state.dirty <= self.state.processed:
            return
        now = clock.now()
        self.checkpoint.earlier(no_sooner_than_minimum(earliest or now, now))

    # -- the durable native backoff (the retry_* fields) -----------------------------------

    @property
    def retrying(self) -> bool:
        """Whether a durable native backoff is recorded (of any generation)."""
        return self.state.retry_generation is not None

    def retry_deadline(self) -> datetime | None:
        """The durable native backoff floor, when it belongs to the current generation."""
        state = self.state
        if state.retry_generation is not None and state.retry_generation == state.dirty:
            return state.retry_not_before
        return None

    def clear_retry(self) -> None:
        """Drop the durable native backoff (all four fields together)."""
        state = self.state
        state.retry_generation = None
        state.retry_not_before = None
        state.retry_native_only = None
        state.retry_stalls = None

    def back_off_native(self, generation: int, not_before: datetime, stalls: int) -> None:
        """Record a native step that made no progress: no native opportunity before
        ``not_before`` for ``generation`` (``stalls`` is the step's charged stall count)."""
        state = self.state
        state.retry_generation = generation
        state.retry_not_before = not_before
        state.retry_native_only = True
        state.retry_stalls = min(backoff.MAX_RETRY_STALLS, stalls + 1)

    def back_off_failure(
        self, generation: int, native_only: bool, now: datetime, jitter: float
    ) -> datetime | None:
        """Record a failed pass of ``generation`` and return the native floor: a native-only
        backoff of that generation is kept; a repeated failure of the same kind doubles the
        previous delay (jittered, ``backoff.backoff_delay_ms``)."""
        state = self.state
        matches = state.retry_generation is not None and state.retry_generation == generation
        if not (matches and state.retry_native_only):
            previous = matches and bool(state.retry_native_only) == native_only
            prev_stalls = (state.retry_stalls or 0) if previous else 0
            prev_floor = state.retry_not_before if previous else None
            floor = now + timedelta(milliseconds=backoff.backoff_delay_ms(prev_stalls, jitter))
            state.retry_generation = generation
            state.retry_not_before = max(prev_floor or floor, floor)
            state.retry_native_only = native_only
            state.retry_stalls = min(backoff.MAX_RETRY_STALLS, prev_stalls + 1)
        return state.retry_not_before


AlarmFn = Callable[[AlarmTx], T]


def resolve_host_id(host: Host | str | int, *, verify: bool = True) -> int:
    """Return the primary key of ``host`` (a Host, its key, or its pk).

    An id is checked to exist unless ``verify`` is False (alarm transactions check it anyway
    when they lock the host).
    """
    if isinstance(host, Host):
        if host.pk is None:
            raise HostNotFound("The host has not been saved", host=host)
        return int(host.pk)
    if isinstance(host, bool):
        raise HostNotFound(f"No host {host!r}", host=host)
    if isinstance(host, int):
        if verify and not Host.objects.filter(pk=host).exists():
            raise HostNotFound(f"No host with id {host}", host=host)
        return host
    if isinstance(host, str):
        if unstorable(host) is not None:  # no stored key holds it (Note [Storable text])
            raise HostNotFound(f"No host with key {host!r}", host=host)
        pk = Host.objects.filter(key=host).values_list("pk", flat=True).first()
        if pk is None:
            raise HostNotFound(f"No host with key {host!r}", host=host)
        return int(pk)
    raise HostNotFound(f"A host is a Host, its key or its id, not {type(host).__name__}")


def user_atomic_depth(using: str = DEFAULT_DB_ALIAS) -> int:
    """How many ``transaction.atomic`` blocks the caller has open (a test case's do not count)."""
    connection = connections[using]
    return sum(
        1 for block in connection.atomic_blocks if not getattr(block, "_from_testcase", False)
    )


def current() -> AlarmTx | None:
    """The alarm transaction this thread is inside, if any."""
    stack: list[AlarmTx] = getattr(_local, "stack", [])
    return stack[-1] if stack else None


def require_alarm_transaction() -> AlarmTx:
    """Return the current alarm transaction; raise if there is none."""
    context = current()
    if context is None:
        raise AlarmError(
            "require alarm transaction",
            "This helper must run inside run_alarm_transaction (it never opens its own)",
        )
    return context


def lock_state(host_id: int) -> MaintenanceState:
    """Lock the host's state row, creating it (``dirty=1, processed=0``) on first use.

    Note [Read the slot after the lock]
        The host row and its schedule are read by a later statement, *after* the state row is
        locked (joined to the lanes, see ``DueQueue.load``). Joined into the locking statement,
        PostgreSQL would return them as of that statement's snapshot, taken before the lock
        wait: a writer that had just created or moved the slot would be invisible, and the
        slot could be created twice.
    """
    state = lock_state_row(host_id)  # Note [Reads written once]
    if state is None:
        if not Host.objects.filter(pk=host_id).exists():
            raise HostNotFound(f"No host with id {host_id}", host=host_id)
        MaintenanceState.objects.bulk_create(
            [MaintenanceState(host_id=host_id)], ignore_conflicts=True
        )
        state = lock_state_row(host_id)
        assert state is not None
    return state


def _state_values(state: MaintenanceState) -> dict[str, Any]:
    return {name: getattr(state, name) for name in _STATE_FIELDS}


@contextmanager
def _entered(context: AlarmTx) -> Iterator[AlarmTx]:
    stack: list[AlarmTx] = getattr(_local, "stack", None) or []
    _local.stack = stack
    stack.append(context)
    try:
        yield context
    finally:
        stack.pop()


def commit_failed() -> AlarmError:
    """The error of a transaction whose commit failed: source facts and checkpoint together."""
    return AlarmError(
        "commit maintenance checkpoint", "Source facts and maintenance checkpoint could not commit"
    )


def run_alarm_transaction(
    host: Host | str | int, operation: str, fn: AlarmFn[T], *, join: bool = False
) -> T:
    """Run ``fn(tx)`` in one transaction with the host's locks held (``tx``: :class:`AlarmTx`).

    Changed state fields and lanes are written (lanes with a revision compare-and-set) and the
    last checkpoint intent is applied to the slot, all before the transaction commits. Inside an
    ambient ``transaction.atomic`` this joins it through a savepoint (with ``join=True``, for a
    caller that fails its whole transaction on any error anyway, without one). Errors other than
    :class:`DurableAgentError` become :class:`AlarmError` ``(operation, message)``; nothing is
    committed either way.
    """
    host_id = resolve_host_id(host, verify=False)
    outermost = user_atomic_depth() == 0
    committing = False
    try:
        with transaction.atomic(savepoint=not (join and not outermost)):
            locked = lock_and_read(host_id)  # Note [Lock and read in one call]
            state = lock_state(host_id) if locked is None else locked[0]
            if state.dirty < 0 or state.processed < 0:
                raise AlarmError(operation, "Maintenance generations must not be negative")
            if locked is None:
                queue, host_row = DueQueue.load(host_id)
            else:
                queue, host_row = DueQueue.of_read(host_id, locked[1])
            if host_row is None:
                raise HostNotFound(f"No host with id {host_id}", host=host_id)
            state.host = host_row
            queue.register(NATIVE)  # the gate's construction: the native lane always exists
            checkpoint = slot_checkpoint(state.host.alarm, clock.now())
            before = _state_values(state)
            tx = AlarmTx(host_id, operation, state, queue, checkpoint)
            with _entered(tx), writes_together(router.db_for_write(MaintenanceState)) as batch:
                result = fn(tx)
                tx.keep_armed()
                _flush_state(state, before, operation)
                queue.flush()
                apply_checkpoint(state.host, checkpoint)
                batch.unflushed = tx.unflushed and outermost
            committing = outermost
        return result
    except DurableAgentError:
        raise
    except DatabaseError as exc:
        if committing:
            raise commit_failed() from exc
        raise AlarmError(operation, _safe_message(exc)) from exc
    except Exception as exc:
        raise AlarmError(operation, _safe_message(exc)) from exc


def _flush_state(state: MaintenanceState, before: dict[str, Any], operation: str) -> None:
    after = _state_values(state)
    changed = {name: value for name, value in after.items() if before[name] != value}
    if not changed:
        return
    if state.dirty < 0 or state.processed < 0:
        raise AlarmError(operation, "Maintenance generations must not be negative")
    update_where(MaintenanceState, {**changed, "updated_at": clock.now()}, {"host": state.pk})


def _safe_message(exc: BaseException) -> str:
    """The first line of ``exc``'s message, storable (Note [Storable text])."""
    text = error_message(exc).strip()
    text = text.splitlines()[0] if text else ""
    return storable(text, limit=500) or f"{type_name(exc)} without a diagnostic"
