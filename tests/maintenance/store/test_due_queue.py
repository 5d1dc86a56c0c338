"""The due queue against upstream's rules (reference 3.6 and the constants in 2.2).

The primitives are pure functions of the lane images, so most tests build a ``DueQueue`` from
``Lane`` images without the database. The persistence tests go through
``run_alarm_transaction`` and check the rows with fresh queries after it returned or raised.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import F

from durable_agent.errors import (
    AlarmError,
    InvalidDeadline,
    InvalidInput,
    InvalidLaneId,
    RevisionConflict,
)
from durable_agent.maintenance import alarm, run_alarm_transaction
from durable_agent.maintenance.store.due_queue import DueQueue
from durable_agent.maintenance.types import Lane
from durable_agent.models import AlarmAudit, DueLane, Host, MaintenanceState
from durable_agent.testing import FakeClock
from tests.factories import T0, AlarmAuditFactory, DueLaneFactory

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOST_ID = 1
LANE = "outbox"
OTHER = "mailer"
NATIVE = "agent:native"
PUBLICATION = "agent:publication"
PENDING, IDLE, PARKED = "pending", "idle", "parked"
SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)

BAD_LANE_IDS = [
    pytest.param("", id="empty"),
    pytest.param("x" * 257, id="257-chars"),
    pytest.param("out box", id="space"),
    pytest.param("out/box", id="slash"),
    pytest.param("outbóx", id="non-ascii"),
    pytest.param("outbox\n", id="trailing-newline"),
    pytest.param("agent:custom", id="reserved-prefix"),
    pytest.param(None, id="none"),
]
BAD_DEADLINES = [
    pytest.param(datetime(2030, 1, 1), id="naive"),
    pytest.param(1_893_456_000_000, id="epoch-ms-int"),
    pytest.param(1_893_456_000.0, id="float"),
    pytest.param("2030-01-01T00:00:00Z", id="iso-string"),
    pytest.param(T0.date(), id="date"),
]
BAD_CURSORS = [
    pytest.param(-1, id="negative"),
    pytest.param(True, id="bool-true"),
    pytest.param(False, id="bool-false"),
    pytest.param(7.0, id="float"),
    pytest.param("7", id="string"),
    pytest.param(None, id="none"),
    pytest.param(10**512, id="513-digits"),
]


def floor_of(row: Lane | DueLane) -> datetime:
    """The retry floor: upstream's ``notBefore`` 0 is stored as null (or the epoch)."""
    return row.not_before or EPOCH


def queue_of(*rows: Lane) -> DueQueue:
    return DueQueue(HOST_ID, rows)


def lane(name: str = LANE, **fields: object) -> Lane:
    return Lane(lane=name, **fields)  # type: ignore[arg-type]


def parked_lane(now: datetime, name: str = LANE, **fields: object) -> Lane:
    values: dict[str, object] = {
        "revision": 4,
        "due_at": now + HOUR,
        "stalls": 8,
        "not_before": now + HOUR,
        "state": PARKED,
        "reported": True,
        "progress_key": "12",
    }
    values.update(fields)
    return lane(name, **values)


def assert_unchanged(queue: DueQueue, before: list[Lane]) -> None:
    assert queue.read() == before
    assert queue.changed == []


# -- register ------------------------------------------------------------------------------


def test_register__creates_a_missing_lane_pending_at_the_epoch_with_revision_zero() -> None:
    queue = queue_of()
    queue.register(LANE)
    row = queue.find(LANE)
    assert row is not None
    assert row.revision == 0
    assert row.due_at == EPOCH
    assert row.state == PENDING
    assert row.stalls == 0
    assert row.progress_key is None
    assert floor_of(row) == EPOCH
    assert row.reported is False
    assert queue.changed == [LANE]


@pytest.mark.parametrize(
    "existing",
    [
        pytest.param(lane(revision=5, due_at=None, state=IDLE), id="idle"),
        pytest.param(parked_lane(T0), id="parked"),
        pytest.param(lane(revision=0, due_at=T0, progress_key="3"), id="pending"),
    ],
)
def test_register__leaves_an_existing_lane_untouched(existing: Lane) -> None:
    queue = queue_of(existing)
    queue.register(LANE)
    assert queue.find(LANE) == existing
    assert queue.changed == []


@pytest.mark.parametrize("bad", BAD_LANE_IDS)
def test_register__rejects_an_invalid_lane_id(bad: object) -> None:
    queue = queue_of(lane(due_at=T0))
    before = queue.read()
    with pytest.raises(InvalidLaneId):
        queue.register(bad)  # type: ignore[arg-type]
    assert_unchanged(queue, before)


# -- dirty ---------------------------------------------------------------------------------


def test_dirty__creates_a_new_lane_at_revision_one(clock: FakeClock) -> None:
    due = clock.now() + 5 * SECOND
    queue = queue_of()
    queue.dirty(LANE, due)
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.due_at, row.state, row.stalls) == (1, due, PENDING, 0)
    assert (floor_of(row), row.reported, row.progress_key) == (EPOCH, False, None)
    assert queue.changed == [LANE]


def test_dirty__new_lane_with_progress_starts_at_revision_one_with_its_key(
    clock: FakeClock,
) -> None:
    queue = queue_of()
    queue.dirty(LANE, clock.now(), progress=True, progress_key="9")
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.due_at, row.progress_key) == (1, clock.now(), "9")


def test_dirty__without_progress_keeps_the_revision_and_moves_a_later_deadline_earlier(
    clock: FakeClock,
) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=3, due_at=now + HOUR, not_before=now - SECOND))
    queue.dirty(LANE, now + 5 * SECOND)
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.due_at) == (3, now + 5 * SECOND)


def test_dirty__without_progress_never_postpones_an_earlier_deadline(clock: FakeClock) -> None:
    now = clock.now()
    existing = lane(revision=3, due_at=now + 5 * SECOND)
    queue = queue_of(existing)
    queue.dirty(LANE, now + HOUR)
    assert queue.find(LANE) == existing
    assert queue.changed == []


def test_dirty__wakes_an_idle_lane_at_the_requested_time(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=2, due_at=None, state=IDLE))
    queue.dirty(LANE, now + 5 * SECOND)
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.due_at, row.state) == (2, now + 5 * SECOND, PENDING)


@pytest.mark.parametrize(
    ("current_due", "requested", "expected"),
    [
        pytest.param(4, 0, 4, id="request-before-floor-is-held-at-floor"),
        pytest.param(4, -10, 4, id="request-in-the-past-is-held-at-floor"),
        pytest.param(4, 10, 4, id="later-request-keeps-floor-deadline"),
        pytest.param(None, 0, 4, id="idle-lane-with-floor-waits-for-floor"),
        pytest.param(30, 10, 10, id="request-after-floor-accelerates-to-request"),
        pytest.param(30, 2, 4, id="request-between-now-and-floor-stops-at-floor"),
    ],
)
def test_dirty__without_progress_never_accelerates_below_the_retry_floor(
    clock: FakeClock, current_due: int | None, requested: int, expected: int
) -> None:
    now = clock.now()
    floor = now + 4 * SECOND
    queue = queue_of(
        lane(
            revision=2,
            due_at=None if current_due is None else now + current_due * SECOND,
            stalls=3,
            not_before=floor,
            reported=False,
            progress_key="7",
        )
    )
    queue.dirty(LANE, now + requested * SECOND)
    row = queue.find(LANE)
    assert row is not None
    assert row.due_at == now + expected * SECOND
    assert (row.revision, row.stalls, floor_of(row), row.progress_key) == (2, 3, floor, "7")
    assert row.state == PENDING


def test_dirty__without_progress_keeps_a_parked_lane_parked(clock: FakeClock) -> None:
    now = clock.now()
    parked = parked_lane(now)
    queue = queue_of(parked)
    queue.dirty(LANE, now)
    queue.dirty(LANE, now - HOUR)
    row = queue.find(LANE)
    assert row == parked
    assert row is not None
    assert (row.state, row.due_at, row.stalls, row.reported) == (PARKED, now + HOUR, 8, True)
    assert queue.changed == []


def test_dirty__without_progress_keeps_stalls_floor_and_report(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(
        lane(revision=6, due_at=now + 30 * SECOND, stalls=5, not_before=now, reported=True)
    )
    queue.dirty(LANE, now + SECOND)
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.stalls, floor_of(row), row.reported) == (6, 5, now, True)
    assert row.due_at == now + SECOND


def test_dirty__progress_bumps_revision_and_replenishes_the_budget(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(parked_lane(now, revision=4))
    queue.dirty(LANE, now + SECOND, progress=True, progress_key="13")
    row = queue.find(LANE)
    assert row is not None
    assert row.revision == 5
    assert row.due_at == now + SECOND  # progress may move below the old floor
    assert (row.state, row.stalls, floor_of(row), row.reported) == (PENDING, 0, EPOCH, False)
    assert row.progress_key == "13"


def test_dirty__progress_may_postpone_to_the_requested_time(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=1, due_at=now))
    queue.dirty(LANE, now + HOUR, progress=True)
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.due_at) == (2, now + HOUR)


def test_dirty__carries_the_progress_key_over_when_none_is_given(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=1, due_at=now + HOUR, progress_key="41"))
    queue.dirty(LANE, now)
    queue.dirty(LANE, now, progress=True)
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.progress_key) == (2, "41")
    queue.dirty(LANE, now, progress=True, progress_key="42")
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.progress_key) == (3, "42")


@pytest.mark.parametrize(
    "requests",
    [
        pytest.param([(5, False), (20, True)], id="dirty-then-later-progress"),
        pytest.param([(20, True), (5, True), (30, True)], id="three-progress-requests"),
        pytest.param([(5, True), (20, False), (40, True)], id="mixed"),
    ],
)
def test_dirty__uses_the_earliest_request_of_this_transaction(
    clock: FakeClock, requests: list[tuple[int, bool]]
) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=1, due_at=None, state=IDLE))
    for offset, progress in requests:
        queue.dirty(LANE, now + offset * SECOND, progress=progress)
    row = queue.find(LANE)
    assert row is not None
    assert row.due_at == now + min(offset for offset, _ in requests) * SECOND
    assert row.revision == 1 + sum(1 for _, progress in requests if progress)


def test_dirty__earliest_request_survives_a_completion_in_the_same_transaction(
    clock: FakeClock,
) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=1, due_at=now))
    wave = queue.find(LANE)
    assert wave is not None
    queue.dirty(LANE, now + 2 * SECOND)
    queue.complete(wave, now + HOUR)
    queue.dirty(LANE, now + HOUR, progress=True)
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.due_at) == (3, now + 2 * SECOND)


def test_dirty__earliest_request_is_per_lane_and_per_transaction(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(lane(LANE, revision=1, due_at=None, state=IDLE), lane(OTHER, revision=1))
    queue.dirty(LANE, now + 5 * SECOND)
    queue.dirty(OTHER, now + HOUR, progress=True)
    other = queue.find(OTHER)
    assert other is not None
    assert other.due_at == now + HOUR  # another lane's request does not count

    row = queue.find(LANE)
    assert row is not None
    next_transaction = queue_of(row)
    next_transaction.dirty(LANE, now + HOUR, progress=True)
    moved = next_transaction.find(LANE)
    assert moved is not None
    assert moved.due_at == now + HOUR  # a new transaction starts without requests


@pytest.mark.parametrize("bad", BAD_LANE_IDS)
def test_dirty__rejects_an_invalid_lane_id(clock: FakeClock, bad: object) -> None:
    queue = queue_of(lane(revision=1, due_at=clock.now() + HOUR))
    before = queue.read()
    with pytest.raises(InvalidLaneId):
        queue.dirty(bad, clock.now())  # type: ignore[arg-type]
    with pytest.raises(InvalidLaneId):
        queue.dirty(bad, clock.now(), progress=True, progress_key="1")  # type: ignore[arg-type]
    assert_unchanged(queue, before)


@pytest.mark.parametrize("framework", [NATIVE, PUBLICATION, "agent:projection", "agent:messages"])
def test_dirty__accepts_framework_lane_ids(clock: FakeClock, framework: str) -> None:
    queue = queue_of()
    queue.dirty(framework, clock.now())
    assert queue.changed == [framework]


@pytest.mark.parametrize("bad", BAD_DEADLINES)
def test_dirty__rejects_a_deadline_that_is_not_an_aware_datetime(
    clock: FakeClock, bad: object
) -> None:
    queue = queue_of(lane(revision=1, due_at=clock.now() + HOUR))
    before = queue.read()
    with pytest.raises(InvalidDeadline):
        queue.dirty(LANE, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidDeadline):
        queue.dirty("new-lane", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidDeadline):
        queue.dirty(LANE, bad, progress=True)  # type: ignore[arg-type]
    assert_unchanged(queue, before)
    # A rejected request is not remembered as this transaction's earliest request.
    queue.dirty(LANE, clock.now() + HOUR, progress=True)
    row = queue.find(LANE)
    assert row is not None
    assert row.due_at == clock.now() + HOUR


# -- progress ------------------------------------------------------------------------------


def test_progress__first_cursor_on_a_missing_lane_creates_it(clock: FakeClock) -> None:
    queue = queue_of()
    assert queue.progress(LANE, clock.now(), 0) is True
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.due_at, row.progress_key, row.state) == (1, clock.now(), "0", PENDING)


def test_progress__first_cursor_on_a_registered_lane_bumps_it(clock: FakeClock) -> None:
    queue = queue_of()
    queue.register(LANE)
    assert queue.progress(LANE, clock.now(), 3) is True
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.due_at, row.progress_key) == (1, clock.now(), "3")


def test_progress__newer_cursor_bumps_revision_and_resets_the_budget(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(parked_lane(now, revision=4, progress_key="12"))
    assert queue.progress(LANE, now + SECOND, 13) is True
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.due_at, row.progress_key) == (5, now + SECOND, "13")
    assert (row.state, row.stalls, floor_of(row), row.reported) == (PENDING, 0, EPOCH, False)


@pytest.mark.parametrize("cursor", [12, 11, 0], ids=["equal", "older", "zero"])
def test_progress__equal_or_older_cursor_is_a_replay_and_changes_nothing(
    clock: FakeClock, cursor: int
) -> None:
    now = clock.now()
    queue = queue_of(parked_lane(now, revision=4, progress_key="12"))
    before = queue.read()
    assert queue.progress(LANE, now, cursor) is False
    assert_unchanged(queue, before)


def test_progress__a_replay_is_not_counted_as_a_request(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=2, due_at=None, state=IDLE, progress_key="12"))
    assert queue.progress(LANE, now, 12) is False
    assert queue.progress(LANE, now + HOUR, 13) is True
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.due_at) == (3, now + HOUR)


def test_progress__compares_cursors_as_integers_not_text(clock: FakeClock) -> None:
    queue = queue_of(lane(revision=1, due_at=None, state=IDLE, progress_key="9"))
    assert queue.progress(LANE, clock.now(), 10) is True  # "10" < "9" as text
    assert queue.progress(LANE, clock.now(), 9) is False
    row = queue.find(LANE)
    assert row is not None
    assert (row.revision, row.progress_key) == (2, "10")


def test_progress__accepts_cursors_of_512_digits_exactly(clock: FakeClock) -> None:
    largest = 10**512 - 1
    queue = queue_of(lane(revision=1, due_at=None, state=IDLE, progress_key=str(largest - 1)))
    assert queue.progress(LANE, clock.now(), largest) is True
    row = queue.find(LANE)
    assert row is not None
    assert row.progress_key == "9" * 512
    assert queue.progress(LANE, clock.now(), largest) is False


@pytest.mark.parametrize("bad", BAD_CURSORS)
def test_progress__rejects_a_cursor_that_is_not_an_int_of_at_most_512_digits(
    clock: FakeClock, bad: object
) -> None:
    queue = queue_of(lane(revision=1, due_at=clock.now() + HOUR, progress_key="5"))
    before = queue.read()
    with pytest.raises(InvalidInput):
        queue.progress(LANE, clock.now(), bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        queue.progress("new-lane", clock.now(), bad)  # type: ignore[arg-type]
    assert_unchanged(queue, before)


@pytest.mark.parametrize("bad", BAD_LANE_IDS)
def test_progress__rejects_an_invalid_lane_id(clock: FakeClock, bad: object) -> None:
    queue = queue_of()
    with pytest.raises(InvalidLaneId):
        queue.progress(bad, clock.now(), 1)  # type: ignore[arg-type]
    assert_unchanged(queue, [])


@pytest.mark.parametrize("bad", BAD_DEADLINES)
def test_progress__rejects_a_bad_deadline_for_a_newer_cursor(clock: FakeClock, bad: object) -> None:
    queue = queue_of(lane(revision=1, due_at=clock.now() + HOUR, progress_key="5"))
    before = queue.read()
    with pytest.raises(InvalidDeadline):
        queue.progress(LANE, bad, 6)  # type: ignore[arg-type]
    assert_unchanged(queue, before)


# -- claim ---------------------------------------------------------------------------------


def test_claim__returns_none_for_a_missing_lane(clock: FakeClock) -> None:
    queue = queue_of()
    assert queue.claim(lane(revision=0, due_at=clock.now()), clock.now()) is None
    assert queue.changed == []


@pytest.mark.parametrize("native", [False, True])
def test_claim__returns_none_when_the_revision_moved(clock: FakeClock, native: bool) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=2, due_at=now))
    seen = queue.find(LANE)
    assert seen is not None
    assert queue.progress(LANE, now, 1) is True
    after_progress = queue.read()
    assert queue.claim(seen, now, native=native) is None
    assert queue.read() == after_progress


@pytest.mark.parametrize("native", [False, True])
def test_claim__returns_none_for_an_idle_lane(clock: FakeClock, native: bool) -> None:
    queue = queue_of(lane(revision=2, due_at=None, state=IDLE))
    before = queue.read()
    assert queue.claim(before[0], clock.now(), native=native) is None
    assert_unchanged(queue, before)


def test_claim__returns_none_before_the_lane_is_due(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=2, due_at=now + SECOND))
    before = queue.read()
    assert queue.claim(before[0], now) is None
    assert_unchanged(queue, before)


def test_claim__claims_a_lane_due_exactly_now(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=2, due_at=now))
    claimed = queue.claim(queue.read()[0], now)
    assert claimed is not None
    assert claimed == queue.find(LANE)
    assert (claimed.stalls, floor_of(claimed), claimed.due_at) == (1, now + SECOND, now + SECOND)
    assert queue.changed == [LANE]


@pytest.mark.parametrize(
    "floor", [pytest.param(None, id="no-floor"), pytest.param(0, id="floor-exactly-now")]
)
def test_claim__native_runs_once_the_floor_passed_even_if_due_later(
    clock: FakeClock, floor: int | None
) -> None:
    now = clock.now()
    row = lane(
        NATIVE,
        revision=2,
        due_at=now + HOUR,
        not_before=None if floor is None else now + floor * SECOND,
    )
    assert queue_of(row).claim(row, now) is None  # not native: waits for due_at
    queue = queue_of(row)
    claimed = queue.claim(row, now, native=True)
    assert claimed is not None
    assert (claimed.revision, claimed.stalls, claimed.due_at) == (2, 1, now + SECOND)


def test_claim__native_waits_for_a_future_floor(clock: FakeClock) -> None:
    now = clock.now()
    row = lane(NATIVE, revision=2, due_at=now + HOUR, stalls=1, not_before=now + SECOND)
    queue = queue_of(row)
    assert queue.claim(row, now, native=True) is None
    assert_unchanged(queue, [row])


def test_claim__floors_double_to_sixty_seconds_then_park_for_an_hour(clock: FakeClock) -> None:
    expected_floors = [1, 2, 4, 8, 16, 32, 60, 3_600]
    queue = queue_of(lane(revision=7, due_at=clock.now(), progress_key="3"))
    wave = queue.find(LANE)
    assert wave is not None
    for attempt, seconds in enumerate(expected_floors, start=1):
        now = clock.now()
        claimed = queue.claim(wave, now)
        assert claimed is not None, attempt
        assert floor_of(claimed) == now + seconds * SECOND, attempt
        assert claimed.due_at == now + seconds * SECOND, attempt
        assert claimed.stalls == attempt, attempt
        assert claimed.state == (PARKED if attempt == 8 else PENDING), attempt
        assert (claimed.revision, claimed.progress_key, claimed.reported) == (7, "3", False)
        # Not claimable again until its floor.
        assert queue.claim(wave, now + seconds * SECOND - timedelta(milliseconds=1)) is None
        clock.advance(ms=seconds * 1_000)


def test_claim__stalls_saturate_at_eight_and_stay_parked(clock: FakeClock) -> None:
    now = clock.now()
    row = lane(revision=3, due_at=now, stalls=8, not_before=now, state=PARKED, reported=True)
    queue = queue_of(row)
    claimed = queue.claim(row, now)
    assert claimed is not None
    assert (claimed.stalls, claimed.state, claimed.reported) == (8, PARKED, True)
    assert (floor_of(claimed), claimed.due_at, claimed.revision) == (now + HOUR, now + HOUR, 3)


# -- complete ------------------------------------------------------------------------------


def test_complete__returns_none_for_a_stale_revision(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=3, due_at=now))
    before = queue.read()
    assert queue.complete(lane(revision=2, due_at=now), None) is None
    assert queue.complete(lane(revision=4, due_at=now), now + SECOND) is None
    assert_unchanged(queue, before)


def test_complete__returns_none_for_a_missing_lane(clock: FakeClock) -> None:
    queue = queue_of()
    assert queue.complete(lane(revision=0), None) is None
    assert queue.read() == []


def test_complete__idle_resets_the_budget_and_bumps_the_revision(clock: FakeClock) -> None:
    now = clock.now()
    wave = parked_lane(now, revision=4, progress_key="12")
    queue = queue_of(wave)
    done = queue.complete(wave, None)
    assert done is not None
    assert done == queue.find(LANE)
    assert (done.revision, done.due_at, done.state) == (5, None, IDLE)
    assert (done.stalls, floor_of(done), done.reported, done.progress_key) == (
        0,
        EPOCH,
        False,
        "12",
    )


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        pytest.param(-5, 4, id="past-request-clamped-to-floor"),
        pytest.param(1, 4, id="request-before-floor-clamped"),
        pytest.param(4, 4, id="request-at-floor"),
        pytest.param(30, 30, id="request-after-floor-kept"),
    ],
)
def test_complete__due_completion_is_clamped_to_the_floor(
    clock: FakeClock, requested: int, expected: int
) -> None:
    now = clock.now()
    wave = lane(revision=2, due_at=now, stalls=3, not_before=now + 4 * SECOND, reported=True)
    queue = queue_of(wave)
    done = queue.complete(wave, now + requested * SECOND)
    assert done is not None
    assert done.due_at == now + expected * SECOND
    assert (done.revision, done.state) == (3, PENDING)
    assert (done.stalls, floor_of(done), done.reported) == (3, now + 4 * SECOND, True)


def test_complete__due_completion_keeps_a_parked_lane_parked(clock: FakeClock) -> None:
    now = clock.now()
    wave = parked_lane(now, revision=4)
    queue = queue_of(wave)
    done = queue.complete(wave, now + SECOND)
    assert done is not None
    assert (done.revision, done.state, done.stalls) == (5, PARKED, 8)
    assert done.due_at == now + HOUR


def test_complete__accepts_the_image_a_claim_left_and_fences_a_second_completion(
    clock: FakeClock,
) -> None:
    now = clock.now()
    queue = queue_of(lane(revision=2, due_at=now))
    wave = queue.find(LANE)
    assert wave is not None
    assert queue.claim(wave, now) is not None
    done = queue.complete(wave, None)  # the claim did not move the revision
    assert done is not None
    assert done.revision == 3
    assert queue.complete(wave, now) is None
    assert queue.find(LANE) == done


@pytest.mark.parametrize("bad", BAD_DEADLINES)
def test_complete__rejects_a_deadline_that_is_not_an_aware_datetime(
    clock: FakeClock, bad: object
) -> None:
    queue = queue_of(lane(revision=2, due_at=clock.now()))
    before = queue.read()
    with pytest.raises(InvalidDeadline):
        queue.complete(before[0], bad)  # type: ignore[arg-type]
    assert_unchanged(queue, before)


# -- checkpoint_native ---------------------------------------------------------------------


def test_checkpoint_native__none_idles_and_resets_without_a_revision_bump(
    clock: FakeClock,
) -> None:
    now = clock.now()
    queue = queue_of(parked_lane(now, NATIVE, revision=6))
    queue.checkpoint_native(None)
    row = queue.find(NATIVE)
    assert row is not None
    assert (row.revision, row.due_at, row.state) == (6, None, IDLE)
    assert (row.stalls, floor_of(row), row.reported, row.progress_key) == (0, EPOCH, False, "12")


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        pytest.param(-5, 4, id="past-request-clamped-to-floor"),
        pytest.param(1, 4, id="request-before-floor-clamped"),
        pytest.param(30, 30, id="request-after-floor-kept"),
    ],
)
def test_checkpoint_native__clamps_to_the_floor_without_a_revision_bump(
    clock: FakeClock, requested: int, expected: int
) -> None:
    now = clock.now()
    queue = queue_of(
        lane(NATIVE, revision=6, due_at=None, state=IDLE, stalls=2, not_before=now + 4 * SECOND)
    )
    queue.checkpoint_native(now + requested * SECOND)
    row = queue.find(NATIVE)
    assert row is not None
    assert (row.revision, row.due_at, row.state) == (6, now + expected * SECOND, PENDING)
    assert (row.stalls, floor_of(row)) == (2, now + 4 * SECOND)


def test_checkpoint_native__keeps_a_parked_native_lane_parked(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(parked_lane(now, NATIVE, revision=6))
    queue.checkpoint_native(now)
    row = queue.find(NATIVE)
    assert row is not None
    assert (row.revision, row.state, row.due_at, row.stalls) == (6, PARKED, now + HOUR, 8)


def test_checkpoint_native__parked_publication_leaves_native_without_a_deadline(
    clock: FakeClock,
) -> None:
    now = clock.now()
    queue = queue_of(
        lane(NATIVE, revision=6, due_at=now, stalls=1, not_before=now),
        parked_lane(now, PUBLICATION),
    )
    queue.checkpoint_native(now + SECOND)
    row = queue.find(NATIVE)
    assert row is not None
    assert (row.revision, row.due_at, row.state, row.stalls) == (6, None, PENDING, 1)
    assert queue.next() == now + HOUR  # only the publication lane's own retry remains


def test_checkpoint_native__pending_publication_does_not_hold_native(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(
        lane(NATIVE, revision=6, due_at=None, state=IDLE),
        lane(PUBLICATION, revision=1, due_at=now + HOUR),
    )
    queue.checkpoint_native(now + SECOND)
    row = queue.find(NATIVE)
    assert row is not None
    assert (row.due_at, row.state) == (now + SECOND, PENDING)


def test_checkpoint_native__does_nothing_without_a_native_lane(clock: FakeClock) -> None:
    queue = queue_of(lane(revision=1, due_at=clock.now()))
    before = queue.read()
    queue.checkpoint_native(clock.now())
    queue.checkpoint_native(None)
    assert queue.find(NATIVE) is None
    assert_unchanged(queue, before)


@pytest.mark.parametrize("bad", BAD_DEADLINES)
def test_checkpoint_native__rejects_a_deadline_that_is_not_an_aware_datetime(
    clock: FakeClock, bad: object
) -> None:
    queue = queue_of(lane(NATIVE, revision=1, due_at=clock.now()))
    before = queue.read()
    with pytest.raises(InvalidDeadline):
        queue.checkpoint_native(bad)  # type: ignore[arg-type]
    assert_unchanged(queue, before)


# -- take_parked_reports and next ----------------------------------------------------------


def test_take_parked_reports__returns_parked_unreported_lanes_once(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(
        parked_lane(now, "a-parked", reported=False),
        parked_lane(now, "b-reported", reported=True),
        lane("c-pending", revision=1, due_at=now, stalls=3, not_before=now),
        lane("d-idle", revision=1, due_at=None, state=IDLE),
        parked_lane(now, "e-parked", reported=False, revision=9),
    )
    before = {row.lane: row for row in queue.read()}
    taken = queue.take_parked_reports()
    assert sorted(row.lane for row in taken) == ["a-parked", "e-parked"]
    assert queue.changed == ["a-parked", "e-parked"]
    for name in ("a-parked", "e-parked"):
        assert queue.find(name) == before[name].replace(reported=True)
    for name in ("b-reported", "c-pending", "d-idle"):
        assert queue.find(name) == before[name]
    assert queue.take_parked_reports() == []


def test_next__is_the_earliest_deadline_of_any_lane(clock: FakeClock) -> None:
    now = clock.now()
    queue = queue_of(
        lane("a", revision=1, due_at=now + HOUR),
        lane("b", revision=1, due_at=None, state=IDLE),
        parked_lane(now, "c", due_at=now + 5 * SECOND),
        lane("d", revision=1, due_at=now + 30 * SECOND),
    )
    assert queue.next() == now + 5 * SECOND


@pytest.mark.parametrize(
    "rows",
    [pytest.param([], id="empty"), pytest.param([lane(due_at=None, state=IDLE)], id="all-idle")],
)
def test_next__is_none_when_nothing_is_due(rows: list[Lane]) -> None:
    assert queue_of(*rows).next() is None


# -- persistence through run_alarm_transaction ---------------------------------------------


def lane_row(host: Host, name: str) -> DueLane | None:
    return DueLane.objects.filter(host=host, lane=name).first()


def db_image(row: DueLane) -> Lane:
    """A Lane image read field by field from a fresh row (independent of Lane.from_model)."""
    return Lane(
        lane=row.lane,
        revision=row.revision,
        due_at=row.due_at,
        stalls=row.stalls,
        progress_key=row.progress_key,
        not_before=row.not_before,
        state=row.state,
        reported=row.reported,
    )


def snapshot(host: Host) -> dict[str, object]:
    """Everything an alarm transaction may write for ``host``, read with fresh queries."""
    state = MaintenanceState.objects.filter(host=host).values().first()
    if state is not None:
        state.pop("updated_at")
    return {
        "state": state,
        "lanes": [db_image(row) for row in DueLane.objects.filter(host=host).order_by("lane")],
        "audits": list(AlarmAudit.objects.filter(host=host).values()),
        "slot": alarm.scheduled(host),
    }


@pytest.fixture
def committed(host: Host, clock: FakeClock) -> Host:
    """A host whose state row, native lane, a host lane and its slot are committed."""
    now = clock.now()

    def setup(tx) -> None:
        queue, checkpoint = tx.queue, tx.checkpoint
        queue.progress(LANE, now + HOUR, 5)
        checkpoint.at(now + HOUR)

    run_alarm_transaction(host, "test setup", setup)
    return host


@pytest.mark.django_db(transaction=True)
def test_run_alarm_transaction__writes_changed_lanes_on_commit(
    host: Host, clock: FakeClock
) -> None:
    now = clock.now()
    seen: dict[str, Lane | None] = {}

    def first(tx):
        queue = tx.queue
        queue.register("registered")
        queue.dirty(OTHER, now + 5 * SECOND)
        assert queue.progress(LANE, now, 41) is True
        seen.update({name: queue.find(name) for name in ("registered", OTHER, LANE)})
        return "result"

    assert run_alarm_transaction(host, "test", first) == "result"
    for name in ("registered", OTHER, LANE):
        row = lane_row(host, name)
        assert row is not None
        assert db_image(row) == seen[name]
    registered = lane_row(host, "registered")
    assert registered is not None
    assert (registered.revision, registered.due_at, registered.state) == (0, EPOCH, PENDING)
    outbox = lane_row(host, LANE)
    assert outbox is not None
    assert (outbox.revision, outbox.due_at, outbox.progress_key) == (1, now, "41")

    # A later transaction claims; the claim's image still completes in a third one.
    def claim(tx):
        queue = tx.queue
        row = queue.find(LANE)
        assert row is not None
        assert queue.claim(row, now) is not None
        return row

    wave = run_alarm_transaction(host, "test", claim)
    claimed = lane_row(host, LANE)
    assert claimed is not None
    assert (claimed.revision, claimed.stalls, claimed.due_at) == (1, 1, now + SECOND)
    assert floor_of(claimed) == now + SECOND

    def complete(tx):
        queue = tx.queue
        return queue.complete(wave, None)

    assert run_alarm_transaction(host, "test", complete) is not None
    done = lane_row(host, LANE)
    assert done is not None
    assert (done.revision, done.due_at, done.state, done.stalls) == (2, None, IDLE, 0)
    assert (floor_of(done), done.reported, done.progress_key) == (EPOCH, False, "41")

    # The fenced wave cannot complete twice.
    assert run_alarm_transaction(host, "test", complete) is None
    again = lane_row(host, LANE)
    assert again is not None
    assert db_image(again) == db_image(done)


@pytest.mark.django_db(transaction=True)
def test_run_alarm_transaction__round_trips_every_lane_field(host: Host, clock: FakeClock) -> None:
    now = clock.now()

    def park(tx):
        queue = tx.queue
        queue.progress(LANE, now, 10**511)  # a 512-digit key
        wave = queue.find(LANE)
        for step in range(8):
            assert queue.claim(wave, now + step * HOUR) is not None
        return queue.take_parked_reports()

    taken = run_alarm_transaction(host, "test", park)
    assert [row.lane for row in taken] == [LANE]
    row = lane_row(host, LANE)
    assert row is not None
    assert db_image(row) == Lane(
        lane=LANE,
        revision=1,
        due_at=now + 7 * HOUR + HOUR,
        stalls=8,
        progress_key=str(10**511),
        not_before=now + 8 * HOUR,
        state=PARKED,
        reported=True,
    )

    def reload(tx):
        queue = tx.queue
        return queue.find(LANE), queue.take_parked_reports()

    loaded, again = run_alarm_transaction(host, "test", reload)
    assert loaded == db_image(row)
    assert again == []


@pytest.mark.django_db(transaction=True)
def test_run_alarm_transaction__persists_a_256_character_lane_id(
    host: Host, clock: FakeClock
) -> None:
    name = "x" * 256

    def fn(tx):
        queue = tx.queue
        queue.dirty(name, clock.now())

    run_alarm_transaction(host, "test", fn)
    row = lane_row(host, name)
    assert row is not None
    assert (row.revision, row.due_at) == (1, clock.now())


@pytest.mark.django_db(transaction=True)
def test_run_alarm_transaction__writes_nothing_when_fn_raises(
    committed: Host, clock: FakeClock
) -> None:
    host = committed
    now = clock.now()
    before = snapshot(host)

    class Boom(Exception):
        pass

    def fn(tx):
        state, queue, checkpoint = tx.state, tx.queue, tx.checkpoint
        state.nonterminal = 7
        state.dirty += 1
        queue.dirty(LANE, now)
        queue.progress("a-new-lane", now, 1)
        queue.checkpoint_native(None)
        AlarmAuditFactory(host=host)
        checkpoint.at(now + SECOND)
        raise Boom("boom")

    with pytest.raises(AlarmError) as excinfo:
        run_alarm_transaction(host, "test", fn)
    assert isinstance(excinfo.value.__cause__, Boom)
    assert snapshot(host) == before
    assert lane_row(host, "a-new-lane") is None
    assert alarm.scheduled(host) == now + HOUR


def _dirty(queue: DueQueue, seen: Lane, now: datetime) -> None:
    queue.dirty(seen.lane, now - SECOND)


def _progress(queue: DueQueue, seen: Lane, now: datetime) -> None:
    assert queue.progress(seen.lane, now + SECOND, 99) is True


def _claim(queue: DueQueue, seen: Lane, now: datetime) -> None:
    assert queue.claim(seen, now) is not None


def _complete(queue: DueQueue, seen: Lane, now: datetime) -> None:
    assert queue.complete(seen, None) is not None


def _checkpoint_native(queue: DueQueue, seen: Lane, now: datetime) -> None:
    queue.checkpoint_native(now + SECOND)


def _take_parked_reports(queue: DueQueue, seen: Lane, now: datetime) -> None:
    assert [row.lane for row in queue.take_parked_reports()] == [seen.lane]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("target", "change"),
    [
        pytest.param("z-lane", _dirty, id="dirty"),
        pytest.param("z-lane", _progress, id="progress"),
        pytest.param("z-lane", _claim, id="claim"),
        pytest.param("z-lane", _complete, id="complete"),
        pytest.param("z-parked", _take_parked_reports, id="take_parked_reports"),
        pytest.param(NATIVE, _checkpoint_native, id="checkpoint_native"),
    ],
)
def test_run_alarm_transaction__revision_moved_behind_the_view_fails_the_whole_commit(
    committed: Host,
    clock: FakeClock,
    target: str,
    change: Callable[[DueQueue, Lane, datetime], None],
) -> None:
    host = committed
    now = clock.now()
    DueLaneFactory(host=host, lane="z-lane", revision=3, due_at=now, progress_key="5")
    DueLaneFactory(
        host=host,
        lane="z-parked",
        revision=3,
        due_at=now + HOUR,
        stalls=8,
        not_before=now + HOUR,
        state=PARKED,
        reported=False,
    )
    before = snapshot(host)

    def fn(tx):
        state, queue, checkpoint = tx.state, tx.queue, tx.checkpoint
        seen = queue.find(target)
        assert seen is not None
        state.nonterminal = 7  # a state field
        queue.dirty("a-other", now)  # another lane, flushed before the target
        AlarmAuditFactory(host=host)  # a fact
        checkpoint.at(now + SECOND)  # the slot
        updated = DueLane.objects.filter(host=host, lane=target).update(revision=F("revision") + 1)
        assert updated == 1
        change(queue, seen, now)
        assert target in queue.changed

    with pytest.raises(RevisionConflict) as excinfo:
        run_alarm_transaction(host, "test", fn)
    assert isinstance(excinfo.value, AlarmError)
    assert "revision changed" in str(excinfo.value)
    assert snapshot(host) == before
    assert lane_row(host, "a-other") is None
    assert AlarmAudit.objects.filter(host=host).count() == 0
    state = MaintenanceState.objects.get(host=host)
    assert state.nonterminal == 0
    assert alarm.scheduled(host) == now + HOUR


@pytest.mark.django_db(transaction=True)
def test_run_alarm_transaction__lane_inserted_behind_the_view_fails_the_whole_commit(
    committed: Host, clock: FakeClock
) -> None:
    host = committed
    now = clock.now()
    before = snapshot(host)

    def fn(tx):
        state, queue = tx.state, tx.queue
        assert queue.find("z-late") is None
        state.nonterminal = 7
        queue.dirty("a-other", now)
        AlarmAuditFactory(host=host)
        DueLane.objects.create(host=host, lane="z-late", revision=0, due_at=now + HOUR)
        queue.dirty("z-late", now)

    with pytest.raises(RevisionConflict):
        run_alarm_transaction(host, "test", fn)
    assert snapshot(host) == before
    assert lane_row(host, "z-late") is None


@pytest.mark.django_db(transaction=True)
def test_run_alarm_transaction__untouched_lane_moved_behind_the_view_does_not_conflict(
    committed: Host, clock: FakeClock
) -> None:
    host = committed
    now = clock.now()
    DueLaneFactory(host=host, lane="z-lane", revision=3, due_at=now + HOUR)

    def fn(tx):
        queue = tx.queue
        DueLane.objects.filter(host=host, lane="z-lane").update(revision=F("revision") + 1)
        queue.dirty(OTHER, now)

    run_alarm_transaction(host, "test", fn)
    moved = lane_row(host, "z-lane")
    assert moved is not None
    assert moved.revision == 4
    other = lane_row(host, OTHER)
    assert other is not None
    assert (other.revision, other.due_at) == (1, now)


@pytest.mark.django_db(transaction=True)
def test_run_alarm_transaction__a_no_op_change_writes_nothing_and_does_not_conflict(
    committed: Host, clock: FakeClock
) -> None:
    host = committed
    now = clock.now()
    DueLaneFactory(host=host, lane="z-lane", revision=3, due_at=now)

    def fn(tx):
        queue = tx.queue
        DueLane.objects.filter(host=host, lane="z-lane").update(revision=F("revision") + 1)
        queue.dirty("z-lane", now + HOUR)  # later than its deadline: set() is a no-op
        queue.register("z-lane")
        assert queue.changed == []
        return queue.find("z-lane")

    seen = run_alarm_transaction(host, "test", fn)
    row = lane_row(host, "z-lane")
    assert row is not None
    assert (row.revision, row.due_at) == (4, now)
    assert seen is not None
    assert seen.revision == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("error", "call"),
    [
        pytest.param(InvalidLaneId, lambda q, now: q.dirty("", now), id="dirty-empty-id"),
        pytest.param(InvalidLaneId, lambda q, now: q.dirty("x" * 257, now), id="dirty-long-id"),
        pytest.param(InvalidLaneId, lambda q, now: q.dirty("a b", now), id="dirty-bad-chars"),
        pytest.param(
            InvalidLaneId, lambda q, now: q.dirty("agent:custom", now), id="dirty-reserved"
        ),
        pytest.param(InvalidLaneId, lambda q, now: q.register("agent:x"), id="register-reserved"),
        pytest.param(
            InvalidLaneId, lambda q, now: q.progress("agent:x", now, 9), id="progress-reserved"
        ),
        pytest.param(
            InvalidDeadline,
            lambda q, now: q.dirty(LANE, now.replace(tzinfo=None)),
            id="dirty-naive",
        ),
        pytest.param(InvalidDeadline, lambda q, now: q.dirty(LANE, 0), id="dirty-int"),
        pytest.param(
            InvalidDeadline,
            lambda q, now: q.progress(LANE, now.replace(tzinfo=None), 9),
            id="progress-naive",
        ),
        pytest.param(
            InvalidDeadline,
            lambda q, now: q.complete(q.find(LANE), now.replace(tzinfo=None)),
            id="complete-naive",
        ),
        pytest.param(
            InvalidDeadline,
            lambda q, now: q.checkpoint_native(now.isoformat()),
            id="checkpoint-native-string",
        ),
        pytest.param(InvalidInput, lambda q, now: q.progress(LANE, now, -1), id="cursor-negative"),
        pytest.param(InvalidInput, lambda q, now: q.progress(LANE, now, True), id="cursor-bool"),
    ],
)
def test_run_alarm_transaction__invalid_input_writes_nothing(
    committed: Host,
    clock: FakeClock,
    error: type[Exception],
    call: Callable[[DueQueue, datetime], object],
) -> None:
    host = committed
    now = clock.now()
    before = snapshot(host)

    def fn(tx):
        state, queue, checkpoint = tx.state, tx.queue, tx.checkpoint
        state.nonterminal = 7
        queue.dirty(OTHER, now)
        AlarmAuditFactory(host=host)
        checkpoint.at(now + SECOND)
        call(queue, now)

    with pytest.raises(error):
        run_alarm_transaction(host, "test", fn)
    assert snapshot(host) == before
    assert lane_row(host, OTHER) is None
