"""The maintenance core's shared value types: every maintenance module may import these.

* :class:`Lane`: an immutable image of one due-queue row, with the deadline and cursor rules.
* :class:`Checkpoint`: the slot intent of one alarm transaction.
* :class:`LaneContext`: what a lane handler gets.
* :class:`ScheduleOp`, :class:`ProgressOp`: the gate's recorded operations.

This module imports no other maintenance module but the leaves (``lane_ids``), so none of
them can form a cycle through it (tests/test_architecture.py).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from durable_agent import clock
from durable_agent.errors import InvalidDeadline, InvalidInput
from durable_agent.models import DueLane, LaneState

if TYPE_CHECKING:
    from durable_agent.models import Host

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_PROGRESS_KEY_LENGTH = 512


@dataclasses.dataclass(frozen=True)
class Lane:
    """An immutable image of one due-queue row."""

    lane: str
    revision: int = 0
    due_at: datetime | None = None
    stalls: int = 0
    progress_key: str | None = None
    not_before: datetime | None = None
    state: str = LaneState.PENDING
    reported: bool = False

    @property
    def floor(self) -> datetime:
        """The retry floor (``not_before``, the epoch when unset)."""
        return self.not_before or EPOCH

    @property
    def parked(self) -> bool:
        return self.state == LaneState.PARKED

    def replace(self, **changes: object) -> Lane:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_model(cls, row: DueLane) -> Lane:
        return cls(
            lane=row.lane,
            revision=row.revision,
            due_at=row.due_at,
            stalls=row.stalls,
            progress_key=row.progress_key,
            not_before=row.not_before,
            state=row.state,
            reported=row.reported,
        )

    def fields(self) -> dict[str, object]:
        return {
            "revision": self.revision,
            "due_at": self.due_at,
            "stalls": self.stalls,
            "progress_key": self.progress_key,
            "not_before": self.not_before,
            "state": self.state,
            "reported": self.reported,
        }


def validate_deadline(value: object, *, name: str = "due_at") -> datetime:
    """Return ``value`` as an aware UTC datetime, or raise :class:`InvalidDeadline`."""
    if not isinstance(value, datetime):
        raise InvalidDeadline(
            f"{name} must be an aware datetime, not {type(value).__name__}", value=value
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidDeadline(f"{name} must be an aware datetime, not a naive one", value=value)
    return value.astimezone(UTC)


def validate_cursor(value: object) -> int:
    """A progress cursor is a committed source fact id: an int >= 0 of at most 512 digits."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(
            f"A progress cursor must be an int >= 0, not {type(value).__name__}", cursor=value
        )
    if value < 0:
        raise InvalidInput(f"A progress cursor must be >= 0, not {value}", cursor=value)
    if len(str(value)) > MAX_PROGRESS_KEY_LENGTH:
        raise InvalidInput(
            f"A progress cursor has at most {MAX_PROGRESS_KEY_LENGTH} digits", cursor=value
        )
    return value


AT = "at"
EARLIER = "earlier"
CANCEL = "cancel"


@dataclass
class Checkpoint:
    """The checkpoint intent of one alarm transaction; the last call wins.

    ``current`` is the time the slot holds, or, with ``queued``, the deadline of a fired slot
    whose delivery waits in the queue and has not begun (Note [A queued delivery holds the
    slot] in ``durable_agent/maintenance/store/rows.py``): it counts as armed at that time
    until a pass begins and spends it (:meth:`spend`).
    """

    current: datetime | None
    intent: tuple[str, datetime | None] | None = None
    queued: bool = False
    spent: bool = False

    def spend(self) -> None:
        """A pass begins: the queued delivery the slot held is used up, and the slot is
        disarmed unless this transaction arms it (it is written either way)."""
        if self.queued:
            self.current, self.queued, self.spent = None, False, True

    def at(self, when: datetime) -> None:
        """Replace the slot with ``when`` (it may move later)."""
        self.intent = (AT, validate_deadline(when, name="alarm time"))

    def earlier(self, when: datetime) -> None:
        """Arm the slot at ``when`` unless it already holds an earlier time."""
        self.intent = (EARLIER, validate_deadline(when, name="alarm time"))

    def cancel(self) -> None:
        """Disarm the slot."""
        self.intent = (CANCEL, None)

    def target(self) -> datetime | None:
        """The slot time once the intent is applied."""
        if self.intent is None:
            return self.current
        operation, when = self.intent
        if operation == AT:
            return when
        if operation == EARLIER:
            assert when is not None
            return when if self.current is None or self.current > when else self.current
        return None


@dataclass
class LaneContext:
    """What a lane handler gets: its host, its lane, its deadline and a cancellation flag."""

    host: Host
    lane: str
    deadline: datetime
    _cancelled: threading.Event

    def now(self) -> datetime:
        return clock.now()

    def cancelled(self) -> bool:
        """True once the pass gave up on this wave (allowance overrun or pass deadline)."""
        return self._cancelled.is_set()


@dataclass(frozen=True)
class ScheduleOp:
    """A gate ``schedule`` recorded in a frame, applied when the outer frame commits."""

    host_id: int
    lane: str
    due_at: datetime
    cursor: int | None
    now: datetime


@dataclass(frozen=True)
class ProgressOp:
    """A gate progress bump recorded in a frame, applied when the outer frame commits."""

    host_id: int
    lanes: frozenset[str]
    now: datetime
    native_source: bool
    due_at: datetime | None = None  # the work is due later than now (a delayed submission)

    @property
    def later(self) -> datetime | None:
        """When the work is due, if that is after ``now``; None: due now."""
        return self.due_at if self.due_at is not None and self.due_at > self.now else None
