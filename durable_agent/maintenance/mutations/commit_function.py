"""gate.transaction's commit in one round trip on PostgreSQL (Note [The commit function]).

The SQL function lives in ``durable_agent/migrations/sql/0015_commit_intent.sql``. This module
folds one host's buffered intent into its arguments, or answers None when the intent is
unusual and must take the Python path (``run_alarm_transaction``):

- a schedule with a progress cursor (it compares cursors and may advance the generation);
- progress due later than now (``record_progress(due_at=...)``: a delayed submission);
- a deadline or a progress time before the epoch (the folding below is exact only from the
  epoch on, because enrollment never moves a lane below the epoch floor);
- any database but PostgreSQL.

Note [Folding the intent per lane]
    ``DueQueue.dirty`` applied call after call to one lane ends in a state that depends only
    on the earliest deadline requested, on how many calls were progress and on whether the
    first call was: progress sets the deadline to the earliest request so far, bumps the
    revision and refills the budget; enrollment afterwards keeps
    ``max(floor, min(due, request))``, which is the earliest request once the floor is the
    epoch; a lane first created by a call starts at revision 1 whatever that call was. An
    existing lane never touched by progress ends at ``max(floor, min(due, earliest))``. The
    function applies exactly this; tests/maintenance/mutations/test_commit_function.py runs the same
    sequences through both paths and compares the rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections, router
from django.utils import timezone

from durable_agent import clock, conf
from durable_agent.errors import AlarmError, DurableAgentError, HostNotFound, RevisionConflict
from durable_agent.maintenance import backoff, failpoints
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.maintenance.store.rows import Update, queued_after
from durable_agent.maintenance.store.transactions import _safe_message
from durable_agent.maintenance.types import EPOCH, ProgressOp, ScheduleOp
from durable_agent.models import MaintenanceState

SQL = (
    "SELECT durable_agent_commit_intent(%s, %s::text[], %s::timestamptz[], %s::integer[], "
    "%s::boolean[], %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
#: The channel of the prompt hint (Note [Prompt hint] in ``gate.py``).
PROMPT_CHANNEL = "durable_agent_prompt"
HINT_SQL = ", pg_notify(%s, %s)"
# Tests turn the function off to run the Python path on PostgreSQL too.
enabled = True


@dataclass
class _LaneIntent:
    due: datetime
    bumps: int = 0
    first_bump: bool = False


@dataclass
class Intent:
    """One host's buffered intent, folded per lane (Note [Folding the intent per lane])."""

    host_id: int
    lanes: dict[str, _LaneIntent] = field(default_factory=dict)
    dirty_bumps: int = 0
    native_touched: bool = False
    wake: datetime | None = None
    wake_after_lanes: bool = False

    def call(self, lane: str, due: datetime, *, progress: bool) -> None:
        found = self.lanes.get(lane)
        if found is None:
            self.lanes[lane] = _LaneIntent(due, int(progress), progress)
            return
        found.due = min(found.due, due)
        found.bumps += int(progress)


def fold(host_id: int, ops: list[object]) -> Intent | None:
    """The intent of ``ops`` (gate ``ScheduleOp``/``ProgressOp``), or None for the Python path."""
    delay = conf.minimum_alarm_delay()
    intent = Intent(host_id)
    for op in ops:
        if isinstance(op, ScheduleOp):
            if op.cursor is not None or op.due_at < EPOCH or op.now < EPOCH:
                return None
            intent.call(op.lane, op.due_at, progress=False)
            intent.wake, intent.wake_after_lanes = op.now + delay, True
        elif isinstance(op, ProgressOp):
            if op.now < EPOCH or op.later is not None:  # due later: the Python path
                return None
            for lane in sorted(op.lanes):
                intent.call(lane, op.now, progress=True)
            if NATIVE in op.lanes:
                intent.native_touched = True
                intent.dirty_bumps += 0 if op.native_source else 1
            intent.wake, intent.wake_after_lanes = op.now + delay, False
        else:
            return None
    return intent if intent.wake is not None else None


def available() -> bool:
    """Whether the commit function serves the database gate.transaction writes to."""
    return enabled and hints()


def hints() -> bool:
    """Whether commits send the prompt hint: on PostgreSQL (SQLite has no notifications)."""
    return connections[router.db_for_write(MaintenanceState)].vendor == "postgresql"


def hint_payload(host_id: int) -> str:
    """``'<alarm cluster> <host id>'``: the cluster whose broker runs the host's slot."""
    return f"{conf.alarm_cluster() or ''} {host_id}"


def send_hint(host_id: int) -> None:
    """Send the prompt hint in the current transaction (PostgreSQL; Note [Prompt hint])."""
    connection = connections[router.db_for_write(MaintenanceState)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [PROMPT_CHANNEL, hint_payload(host_id)])


def commit(intent: Intent, operation: str, *, hint: bool = False) -> int:
    """Apply ``intent`` in the caller's transaction; return the lane rows written. With
    ``hint``, the same statement sends the prompt hint (Note [Prompt hint] in ``gate.py``).

    Errors are those of ``run_alarm_transaction``: ``HostNotFound``, ``RevisionConflict``,
    else ``AlarmError(operation, ...)``. ``maintenance:queue:flush`` is passed after the call
    when it wrote lanes (still before COMMIT: a crash there rolls everything back).
    """
    sql, params = _call(intent, hint)
    with _translated_errors(intent.host_id, operation):
        row = _fetch(sql, params)
        written = int(row[0]) if row is not None else 0
        if written:
            failpoints.hit("maintenance:queue:flush")
    return written


def commit_with_update(
    intent: Intent, update: Update, operation: str, *, hint: bool = False
) -> bool:
    """Run the conditional ``UPDATE`` of ``update`` and, only when it writes a row, apply
    ``intent`` in the same statement (Note [A write and its progress in one statement] in
    ``gate.py``): whether a row was written. Outside a transaction the statement commits by
    itself. Errors as :func:`commit`'s. ``maintenance:queue:flush`` is passed before the
    statement: a crash there leaves nothing written, as a crash before a transaction's
    COMMIT does.
    """
    sql, params = _call(intent, hint)
    statement = f"WITH written AS ({update.sql} RETURNING 1) {sql} FROM written"
    with _translated_errors(intent.host_id, operation):
        failpoints.hit("maintenance:queue:flush")
        return _fetch(statement, [*update.params, *params]) is not None


def _call(intent: Intent, hint: bool) -> tuple[str, list[Any]]:
    """The function's call for ``intent`` (with the hint's ``pg_notify``), and its arguments."""
    assert intent.wake is not None
    names = list(intent.lanes)
    now = clock.now()
    params: list[Any] = [
        intent.host_id,
        names,
        [intent.lanes[n].due for n in names],
        [intent.lanes[n].bumps for n in names],
        [intent.lanes[n].first_bump for n in names],
        NATIVE,
        intent.dirty_bumps,
        intent.native_touched,
        intent.wake,
        intent.wake_after_lanes,
        now,
        timezone.now(),
        backoff.MAXIMUM_NO_PROGRESS_REARMS,
        EPOCH,
        conf.alarm_task(),
        conf.alarm_cluster(),
        queued_after(now),
    ]
    if hint:
        return SQL + HINT_SQL, [*params, PROMPT_CHANNEL, hint_payload(intent.host_id)]
    return SQL, params


def _fetch(sql: str, params: list[Any]) -> tuple[Any, ...] | None:
    connection = connections[router.db_for_write(MaintenanceState)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row: tuple[Any, ...] | None = cursor.fetchone()
    return row


@contextmanager
def _translated_errors(host_id: int, operation: str) -> Iterator[None]:
    """The errors of ``run_alarm_transaction`` (:func:`commit`)."""
    try:
        yield
    except DurableAgentError:
        raise
    except DatabaseError as exc:
        raise _translated(exc, host_id, operation) from exc
    except Exception as exc:
        raise AlarmError(operation, _safe_message(exc)) from exc


def _translated(exc: DatabaseError, host_id: int, operation: str) -> DurableAgentError:
    cause = exc.__cause__
    code = getattr(cause, "sqlstate", None)
    if code == "DA001":
        return HostNotFound(f"No host with id {host_id}", host=host_id)
    if code == "DA002":
        diag = getattr(cause, "diag", None)
        return RevisionConflict(
            "flush maintenance due queue",
            "Maintenance due revision changed during transaction",
            lane=getattr(diag, "message_detail", None),
        )
    if code == "DA003":
        return AlarmError(operation, "Maintenance generations must not be negative")
    return AlarmError(operation, _safe_message(exc))
