"""The due queue: one row of scheduling metadata per lane of a host.

A :class:`DueQueue` is the buffered view of one host's lanes inside one alarm transaction. The
primitives are pure functions of the rows; :meth:`DueQueue.flush` writes every changed row with
a compare-and-set on ``revision``: a row that moved behind the view fails the whole transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction

from durable_agent.errors import RevisionConflict
from durable_agent.maintenance import backoff, failpoints
from durable_agent.maintenance.lane_ids import NATIVE, PUBLICATION, validate_lane_id
from durable_agent.maintenance.store.rows import (
    LanesRead,
    Stored,
    Tickets,
    load_lanes_and_tickets,
    update_where,
)
from durable_agent.maintenance.types import EPOCH, Lane, validate_cursor, validate_deadline
from durable_agent.models import DueLane, Host, LaneState


def _ms(milliseconds: int) -> timedelta:
    return timedelta(milliseconds=milliseconds)


class DueQueue:
    """The buffered view of one host's lanes inside one alarm transaction.

    Size: the due queue's primitives are one state machine over the buffered rows.
    """

    def __init__(self, host_id: int, rows: Iterable[Lane]) -> None:
        self.host_id = host_id
        self._rows: dict[str, Lane] = {row.lane: row for row in rows}
        # First-seen before-image of every lane changed in this transaction (None = insert).
        self._before: dict[str, Lane | None] = {}
        # The earliest deadline requested per lane in this transaction.
        self._requested: dict[str, datetime] = {}
        # The host's mutation tickets, when read with the lanes (Note [The tickets come with
        # the lanes] in rows.py); None: ask the database.
        self.tickets: Tickets | None = None
        # Whether the host has recovery faults and binding waits, when read with the lanes
        # (Note [Begin knows the native step's records] in rows.py); None: not read.
        self.stored: Stored | None = None

    @classmethod
    def load(cls, host_id: int) -> tuple[DueQueue, Host | None]:
        """Read (and on PostgreSQL lock) the host's rows, in lane order, with the host and its
        alarm slot joined in (one statement; see Note [Read the slot after the lock])."""
        return cls.of_read(host_id, load_lanes_and_tickets(host_id))

    @classmethod
    def of_read(cls, host_id: int, read: LanesRead) -> tuple[DueQueue, Host | None]:
        """:meth:`load` from what was read already (Note [Lock and read in one call] in
        ``rows.py``)."""
        host = read.host
        if host is None:  # no lanes yet (a first use): the host and its slot alone
            host = Host.objects.select_related("alarm").filter(pk=host_id).first()
        queue = cls(host_id, read.lanes)
        queue.tickets, queue.stored = read.tickets, read.stored
        return queue, host

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
        keep_earlier: bool = False,
    ) -> Lane:
        """Enroll ``lane`` for ``due_at``.

        Without progress this never accelerates a lane below its retry floor and keeps a parked
        lane parked; source progress replenishes the budget (stalls, floor and report reset).
        ``keep_earlier`` (progress due later than now): a deadline the lane already has that
        is sooner is kept.
        """
        validate_lane_id(lane)
        due_at = validate_deadline(due_at)
        row = self.find(lane)
        earliest = min(self._requested.get(lane, due_at), due_at)
        self._requested[lane] = earliest
        if row is None:
            return self.set(Lane(lane=lane, revision=1, due_at=earliest, progress_key=progress_key))
        if progress and keep_earlier and row.due_at is not None:
            due = min(row.due_at, earliest)  # progress due later never delays what is due
        elif progress:
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

    def checkpoint_native(self, due_at: datetime | None, *, on_time: bool = False) -> None:
        """Set the native lane's deadline (no revision bump: the native generation fences it).

        ``on_time``: the only work left waits for a time (Note [Delayed heads] in
        ``passes/native.py``), so the pass was not a stall: the claim's floor and stall count
        are dropped and the lane is due exactly at ``due_at``.
        """
        row = self.find(NATIVE)
        if row is None:
            return
        if on_time and due_at is not None and not row.parked:
            row = row.replace(stalls=0, not_before=None, reported=False)
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
            update_where(
                DueLane,
                after.fields(),
                {"host": self.host_id, "lane": lane, "revision": before.revision},
                then=functools.partial(_compared_and_set, lane),
            )
        self._before.clear()
        return len(changes)


def _compared_and_set(lane: str, written: int) -> None:
    """A lane's revision compare-and-set wrote its row, or the lane changed behind the view."""
    if written != 1:
        raise RevisionConflict(
            "flush maintenance due queue",
            "Maintenance due revision changed during transaction",
            lane=lane,
        )
