"""The due queue: one row of scheduling metadata per lane of a host.

A :class:`DueQueue` is the buffered view of one host's lanes inside one alarm transaction. The
primitives are pure functions of the rows; :meth:`DueQueue.flush` writes every changed row with
a compare-and-set on ``revision``: a row that moved behind the view fails the whole transaction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, transaction

from durable_agent.errors import InvalidDeadline, InvalidInput, RevisionConflict
from durable_agent.maintenance import backoff, failpoints
from durable_agent.maintenance.lane_ids import NATIVE, PUBLICATION, validate_lane_id
from durable_agent.models import DueLane, Host, LaneState

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


def _ms(milliseconds: int) -> timedelta:
    return timedelta(milliseconds=milliseconds)


class DueQueue:
    """The buffered view of one host's lanes inside one alarm transaction."""

    def __init__(self, host_id: int, rows: Iterable[Lane]) -> None:
        self.host_id = host_id
        self._rows: dict[str, Lane] = {row.lane: row for row in rows}
        # First-seen before-image of every lane changed in this transaction (None = insert).
        self._before: dict[str, Lane | None] = {}
        # The earliest deadline requested per lane in this transaction.
        self._requested: dict[str, datetime] = {}

    @classmethod
    def load(cls, host_id: int) -> tuple[DueQueue, Host | None]:
        """Read (and on PostgreSQL lock) the host's rows, in lane order, with the host and its
        alarm slot joined in (one statement; see Note [Read the slot after the lock])."""
        from durable_agent.maintenance.rows import load_lanes  # Note [Reads written once]

        rows, host = load_lanes(host_id)
        if host is None:  # no lanes yet (a first use): the host and its slot alone
            host = Host.objects.select_related("alarm").filter(pk=host_id).first()
        return cls(host_id, rows), host

    # -- reading ---------------------------------------------------------------------------

    def find(self, lane: str) -> Lane | None:
        return self._rows.get(lane)

    def read(self) -> list[Lane]:
        return [self._rows[key] for key in sorted(self._rows)]

    def next(self) -> datetime | None:
        """The earliest ``due_at`` of any lane (None when every lane is idle)."""
        deadlines = [row.due_at for row in self._rows.values() if row.due_at is not None]
        return min(deadlines) if deadlines else None

    @property
    def changed(self) -> list[str]:
        return sorted(
            lane for lane, before in self._before.items() if before != self._rows.get(lane)
        )

    # -- writing ---------------------------------------------------------------------------

    def set(self, after: Lane) -> Lane:
        current = self._rows.get(after.lane)
        if current == after:
            return after
        self._before.setdefault(after.lane, current)
        self._rows[after.lane] = after
        return after

    def register(self, lane: str) -> Lane:
        """Create the lane due at once if it does not exist yet (the initial wave)."""
        validate_lane_id(lane)
        row = self.find(lane)
        if row is not None:
            return row
        return self.set(Lane(lane=lane, revision=0, due_at=EPOCH, state=LaneState.PENDING))

    def dirty(
        self,
        lane: str,
        due_at: datetime,
        *,
        progress: bool = False,
        progress_key: str | None = None,
    ) -> Lane:
        """Enroll ``lane`` for ``due_at``.

        Without progress this never accelerates a lane below its retry floor and keeps a parked
        lane parked; source progress replenishes the budget (stalls, floor and report reset).
        """
        validate_lane_id(lane)
        due_at = validate_deadline(due_at)
        row = self.find(lane)
        earliest = min(self._requested.get(lane, due_at), due_at)
        self._requested[lane] = earliest
        if row is None:
            return self.set(Lane(lane=lane, revision=1, due_at=earliest, progress_key=progress_key))
        if progress:
            due = earliest
        else:
            current = row.due_at if row.due_at is not None else earliest
            due = max(row.floor, min(current, earliest))
        return self.set(
            row.replace(
                revision=row.revision + (1 if progress else 0),
                due_at=due,
                state=(
                    LaneState.PENDING
                    if progress or row.stalls < backoff.MAXIMUM_NO_PROGRESS_REARMS
                    else row.state
                ),
                stalls=0 if progress else row.stalls,
                not_before=None if progress else row.not_before,
                reported=False if progress else row.reported,
                progress_key=progress_key or row.progress_key,
            )
        )

    def progress(self, lane: str, due_at: datetime, cursor: int) -> bool:
        """Record source progress with a strictly increasing cursor.

        An equal or older cursor is a replayed notice and changes nothing (returns False).
        """
        cursor = validate_cursor(cursor)
        row = self.find(lane)
        if row is not None and row.progress_key is not None and cursor <= int(row.progress_key):
            return False
        self.dirty(lane, due_at, progress=True, progress_key=str(cursor))
        return True

    def claim(self, lane: Lane, now: datetime, *, native: bool = False) -> Lane | None:
        """Debit one attempt before fallible work; the revision is unchanged.

        Sets the retry floor to 1 s, 2 s, 4 s ... 60 s; the eighth claim without progress parks
        the lane for an hour.
        """
        row = self.find(lane.lane)
        if row is None or row.revision != lane.revision or row.due_at is None:
            return None
        if not (row.due_at <= now or (native and row.floor <= now)):
            return None
        stalls = min(row.stalls + 1, backoff.MAXIMUM_NO_PROGRESS_REARMS)
        not_before = now + _ms(backoff.claim_floor_ms(row.stalls))
        return self.set(
            row.replace(
                stalls=stalls,
                not_before=not_before,
                due_at=not_before,
                state=(
                    LaneState.PARKED
                    if stalls >= backoff.MAXIMUM_NO_PROGRESS_REARMS
                    else LaneState.PENDING
                ),
            )
        )

    def complete(self, lane: Lane, due_at: datetime | None) -> Lane | None:
        """Finish a wave: idle (``None``) resets the budget, else requeue at the floor at least.

        A compare-and-set on the revision the wave saw; bumps the revision.
        """
        row = self.find(lane.lane)
        if row is None or row.revision != lane.revision:
            return None
        if due_at is None:
            after = row.replace(
                due_at=None, state=LaneState.IDLE, stalls=0, not_before=None, reported=False
            )
        else:
            due_at = validate_deadline(due_at)
            after = row.replace(
                due_at=max(due_at, row.floor),
                state=(
                    LaneState.PARKED
                    if row.stalls >= backoff.MAXIMUM_NO_PROGRESS_REARMS
                    else LaneState.PENDING
                ),
            )
        return self.set(after.replace(revision=row.revision + 1))

    def checkpoint_native(self, due_at: datetime | None) -> None:
        """Set the native lane's deadline (no revision bump: the native generation fences it)."""
        row = self.find(NATIVE)
        if row is None:
            return
        publication = self.find(PUBLICATION)
        if due_at is None:
            self.set(
                row.replace(
                    due_at=None, state=LaneState.IDLE, stalls=0, not_before=None, reported=False
                )
            )
            return
        due_at = validate_deadline(due_at)
        self.set(
            row.replace(
                due_at=None
                if publication is not None and publication.parked
                else max(due_at, row.floor),
                state=(
                    LaneState.PARKED
                    if row.stalls >= backoff.MAXIMUM_NO_PROGRESS_REARMS
                    else LaneState.PENDING
                ),
            )
        )

    def take_parked_reports(self) -> list[Lane]:
        """Mark parked, unreported lanes reported and return them."""
        taken = [row for row in self.read() if row.parked and not row.reported]
        for row in taken:
            self.set(row.replace(reported=True))
        return taken

    # -- persistence -----------------------------------------------------------------------

    def flush(self) -> int:
        """Write every changed lane with a revision compare-and-set; return the rows written."""
        changes = [(lane, self._before[lane], self._rows[lane]) for lane in self.changed]
        if not changes:
            return 0
        failpoints.hit("maintenance:queue:flush")
        from durable_agent.maintenance.rows import update_where  # Note [Reads written once]

        for lane, before, after in changes:
            if before is None:
                try:
                    with transaction.atomic():
                        DueLane.objects.create(host_id=self.host_id, lane=lane, **after.fields())
                except IntegrityError as exc:
                    raise RevisionConflict(
                        "flush maintenance due queue",
                        "Maintenance due revision changed during transaction",
                        lane=lane,
                    ) from exc
                continue
            written = update_where(
                DueLane,
                after.fields(),
                {"host": self.host_id, "lane": lane, "revision": before.revision},
            )
            if written != 1:
                raise RevisionConflict(
                    "flush maintenance due queue",
                    "Maintenance due revision changed during transaction",
                    lane=lane,
                )
        self._before.clear()
        return len(changes)
