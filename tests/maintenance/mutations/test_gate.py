"""The mutation gate: buffered source transactions, prearmed mutations and misuse errors."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django_q.models import Schedule

from durable_agent.errors import (
    GateMisuse,
    HostNotFound,
    InvalidDeadline,
    InvalidLaneId,
    RevisionConflict,
)
from durable_agent.maintenance import (
    alarm,
    commit_function,
    failpoints,
    gate,
    registry,
    run_alarm_transaction,
)
from durable_agent.maintenance.failpoints import FailpointError
from durable_agent.maintenance.lane_ids import NATIVE, PUBLICATION
from durable_agent.models import AlarmAudit, DueLane, Host, MaintenanceState, MutationTicket
from durable_agent.testing import FakeClock
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db
S = timedelta(seconds=1)
MIN = timedelta(milliseconds=50)


def state(host: Host) -> MaintenanceState:
    return MaintenanceState.objects.get(host=host)


def lane(host: Host, lane_id: str) -> DueLane:
    return DueLane.objects.get(host=host, lane=lane_id)


def fact(host: Host, clock: FakeClock, actor: str = "fact") -> AlarmAudit:
    """Stand-in for a source fact written in the caller's transaction."""
    return AlarmAudit.objects.create(host=host, actor=actor, generation=0, at=clock.now())


# -- gate.transaction ----------------------------------------------------------------------


def test_transaction__intent_is_buffered_until_commit(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    with gate.transaction(host) as tx:
        tx.schedule("outbox", clock.now() + 5 * S)
        assert not DueLane.objects.filter(host=host, lane="outbox").exists()
        assert alarm.scheduled(host) is None
    assert lane(host, "outbox").due_at == clock.now() + 5 * S
    assert alarm.scheduled(host) == clock.now() + 5 * S


def test_transaction__source_facts_and_intent_roll_back_together(
    host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    dirty = state(host).dirty
    with pytest.raises(RuntimeError, match="source failed"), gate.transaction(host) as tx:
        fact(host, clock)
        tx.schedule("outbox", clock.now() + 5 * S)
        tx.record_progress([NATIVE])
        raise RuntimeError("source failed")
    assert AlarmAudit.objects.count() == 0
    assert not DueLane.objects.filter(host=host, lane="outbox").exists()
    assert state(host).dirty == dirty
    assert alarm.scheduled(host) is None


def test_transaction__record_progress_on_native_advances_the_generation(
    host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    before = state(host)
    with gate.transaction(host) as tx:
        fact(host, clock)
        tx.record_progress([NATIVE])
    after = state(host)
    assert after.dirty == before.dirty + 1
    assert after.processed == before.processed
    native = lane(host, NATIVE)
    assert native.due_at == clock.now()
    assert native.revision == 1
    assert alarm.scheduled(host) == clock.now() + MIN


def test_transaction__record_progress_clears_the_durable_backoff(
    host: Host, clock: FakeClock
) -> None:
    def backoff(tx):
        state = tx.state
        state.retry_generation = state.dirty
        state.retry_not_before = clock.now() + 5 * S
        state.retry_native_only = True
        state.retry_stalls = 3

    run_alarm_transaction(host, "t", backoff)
    with gate.transaction(host) as tx:
        tx.record_progress([NATIVE])
    after = state(host)
    assert (after.retry_generation, after.retry_not_before, after.retry_stalls) == (
        None,
        None,
        None,
    )


def test_transaction__host_lane_progress_replenishes_its_budget(
    host: Host, clock: FakeClock
) -> None:
    def parked(tx):
        queue = tx.queue
        row = queue.dirty("outbox", clock.now())
        for _ in range(8):
            row = queue.claim(queue.find("outbox"), queue.find("outbox").due_at)
        assert row is not None
        assert row.parked

    run_alarm_transaction(host, "t", parked)
    dirty = state(host).dirty
    with gate.transaction(host) as tx:
        tx.record_progress(["outbox"])
    row = lane(host, "outbox")
    assert (row.state, row.stalls, row.not_before, row.due_at) == (
        "pending",
        0,
        None,
        clock.now(),
    )
    assert state(host).dirty == dirty  # host lanes do not advance the native generation


def test_transaction__progress_cursor_is_strictly_increasing(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    with gate.transaction(host) as tx:
        tx.schedule("outbox", clock.now() + S, progress_cursor=7)
    assert (lane(host, "outbox").revision, lane(host, "outbox").progress_key) == (1, "7")
    with gate.transaction(host) as tx:
        tx.schedule("outbox", clock.now() + S, progress_cursor=7)  # replayed notice
    assert lane(host, "outbox").revision == 1
    with gate.transaction(host) as tx:
        tx.schedule("outbox", clock.now() + S, progress_cursor=8)
    assert (lane(host, "outbox").revision, lane(host, "outbox").progress_key) == (2, "8")


def test_transaction__native_progress_cursor_advances_the_generation(
    host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    dirty = state(host).dirty
    gate.schedule(host, NATIVE, clock.now(), progress_cursor=1)
    gate.schedule(host, NATIVE, clock.now(), progress_cursor=1)  # replay: no second bump
    assert state(host).dirty == dirty + 1


def test_transaction__nested_child_merges_on_success(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    with gate.transaction(host) as outer:
        outer.schedule("a", clock.now() + 10 * S)
        with gate.transaction(host) as inner:
            inner.schedule("b", clock.now() + 5 * S)
        assert not DueLane.objects.filter(host=host, lane="b").exists()
    assert {r.lane for r in DueLane.objects.filter(host=host)} >= {"a", "b"}
    assert alarm.scheduled(host) == clock.now() + 5 * S


def test_transaction__nested_child_failure_is_discarded(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    with gate.transaction(host) as outer:
        fact(host, clock, "outer")
        outer.schedule("a", clock.now() + 10 * S)
        with pytest.raises(RuntimeError), gate.transaction(host) as inner:
            fact(host, clock, "inner")
            inner.schedule("b", clock.now() + 1 * S)
            raise RuntimeError("child failed")
    assert list(AlarmAudit.objects.values_list("actor", flat=True)) == ["outer"]
    assert not DueLane.objects.filter(host=host, lane="b").exists()
    assert alarm.scheduled(host) == clock.now() + 10 * S


def test_transaction__one_frame_may_carry_several_hosts(host: Host, clock: FakeClock) -> None:
    other = Host.objects.create(key="other")
    caught_up(host)
    caught_up(other)
    with gate.transaction(host) as tx:
        tx.schedule("a", clock.now() + 3 * S)
        gate.schedule(other, "b", clock.now() + 4 * S)  # joins the enclosing frame
        assert not DueLane.objects.filter(host=other, lane="b").exists()
    assert alarm.scheduled(host) == clock.now() + 3 * S
    assert alarm.scheduled(other) == clock.now() + 4 * S


def test_transaction__revision_changed_behind_the_view_fails_the_commit(
    host: Host, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Python path's buffered view; the commit function reads and writes under one lock
    # (tests/maintenance/mutations/test_commit_function.py covers its compare-and-set).
    monkeypatch.setattr(commit_function, "enabled", False)
    caught_up(host)
    gate.schedule(host, "outbox", clock.now() + 60 * S)

    def move_the_row(name: str) -> None:
        if name == "maintenance:queue:flush":
            DueLane.objects.filter(host=host, lane="outbox").update(revision=99)

    with (
        pytest.raises(RevisionConflict, match="Maintenance due revision changed"),
        failpoints.installed(move_the_row),
        gate.transaction(host) as tx,
    ):
        fact(host, clock)
        tx.schedule("outbox", clock.now() + 1 * S)
    assert AlarmAudit.objects.count() == 0
    assert lane(host, "outbox").revision == 1  # the raw update rolled back with the rest
    assert alarm.scheduled(host) == clock.now() + 60 * S


def test_schedule__standalone_commits_its_own_transaction(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    gate.schedule(host, "outbox", clock.now() + 5 * S)
    assert alarm.scheduled(host) == clock.now() + 5 * S
    gate.schedule(host, "outbox", clock.now() + 50 * S)  # later request: earlier one stands
    assert lane(host, "outbox").due_at == clock.now() + 5 * S
    assert alarm.scheduled(host) == clock.now() + 5 * S


def test_schedule__never_sooner_than_the_minimum_delay(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    gate.schedule(host, "outbox", clock.now() - 5 * S)
    assert alarm.scheduled(host) == clock.now() + MIN


def test_schedule__inside_a_raw_atomic_joins_it(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    with pytest.raises(RuntimeError), transaction.atomic():
        gate.schedule(host, "outbox", clock.now() + 5 * S)
        assert alarm.scheduled(host) == clock.now() + 5 * S  # eager
        raise RuntimeError("rolled back")
    assert alarm.scheduled(host) is None
    assert not DueLane.objects.filter(host=host, lane="outbox").exists()


# -- misuse --------------------------------------------------------------------------------


def test_misuse__mutation_inside_an_atomic_block(host: Host, clock: FakeClock) -> None:
    with transaction.atomic(), pytest.raises(GateMisuse) as info, gate.mutation(host):
        pass  # pragma: no cover
    assert str(info.value) == (
        "prearm maintenance mutation: Run the mutation outside the source transaction so "
        "prearming commits first"
    )
    assert MutationTicket.objects.count() == 0


def test_misuse__mutation_inside_gate_transaction(host: Host, clock: FakeClock) -> None:
    with gate.transaction(host), pytest.raises(GateMisuse, match="prearming commits first"):
        with gate.mutation(host):
            pass  # pragma: no cover


def test_misuse__raw_atomic_around_gate_transaction(host: Host, clock: FakeClock) -> None:
    with transaction.atomic(), pytest.raises(GateMisuse) as info, gate.transaction(host):
        pass  # pragma: no cover
    assert str(info.value) == (
        "begin maintenance source transaction: Use gate.transaction at the outermost source "
        "transaction: an enclosing raw transaction.atomic cannot own buffered maintenance intent"
    )


def test_misuse__raw_atomic_between_two_frames(host: Host, clock: FakeClock) -> None:
    with (
        gate.transaction(host),
        transaction.atomic(),
        pytest.raises(GateMisuse, match="cannot own buffered"),
        gate.transaction(host),
    ):
        pass  # pragma: no cover


def test_misuse__progress_outside_its_source_transaction(host: Host, clock: FakeClock) -> None:
    with gate.transaction(host) as tx:
        pass
    with pytest.raises(GateMisuse) as info:
        tx.record_progress([NATIVE])
    assert str(info.value) == (
        "record source progress: Source progress requires its authoritative transaction: call "
        "tx.record_progress inside its gate.transaction block"
    )
    with pytest.raises(GateMisuse, match="Source progress requires its authoritative"):
        gate.record_progress(host, [NATIVE])


def test_misuse__scheduling_under_a_raw_atomic_inside_a_frame(host: Host, clock: FakeClock) -> None:
    with gate.transaction(host) as tx, transaction.atomic():
        with pytest.raises(GateMisuse) as info:
            tx.schedule("outbox", clock.now())
        assert str(info.value) == (
            "enroll maintenance source: Nested source scheduling requires gate.transaction "
            "(a raw transaction.atomic cannot own maintenance intent)"
        )
        with pytest.raises(GateMisuse, match="Nested source scheduling"):
            gate.schedule(host, "outbox", clock.now())
        with pytest.raises(GateMisuse, match="Source progress requires"):
            gate.record_progress(host, ["outbox"])


def test_misuse__handle_of_an_outer_frame_inside_a_child(host: Host, clock: FakeClock) -> None:
    with gate.transaction(host) as outer, gate.transaction(host):
        with pytest.raises(GateMisuse, match=r"inside its own gate\.transaction"):
            outer.schedule("outbox", clock.now())


# -- gate.mutation -------------------------------------------------------------------------


def test_mutation__prearm_commits_generation_ticket_and_alarm_before_the_body(
    host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    dirty = state(host).dirty
    with gate.mutation(host):
        inside = state(host)
        assert inside.dirty == dirty + 1
        assert inside.processed == dirty
        assert alarm.scheduled(host) == clock.now() + MIN
        ticket = MutationTicket.objects.get(host=host)
        assert ticket.lanes == [NATIVE]
        assert ticket.expires_at == clock.now() + 60 * S
        assert gate.snapshot(host, lambda active: active) == 1
    assert MutationTicket.objects.count() == 0
    assert gate.snapshot(host, lambda active: active) == 0
    assert state(host).dirty == dirty + 1
    # The end of the mutation pulls the slot to whatever is due (the native lane, now).
    assert alarm.scheduled(host) == clock.now()


def test_mutation__failpoints_in_order(host: Host, clock: FakeClock) -> None:
    seen: list[str] = []
    with failpoints.installed(failpoints.recorder(seen)), gate.mutation(host):
        seen.append("body")
    assert seen == [
        "maintenance:dirty:before",
        "maintenance:queue:flush",
        "maintenance:dirty:after",
        "maintenance:mutation:armed",
        "body",
        "maintenance:mutation:finished",
    ]


def test_mutation__body_failure_keeps_the_generation_and_alarm(
    host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    dirty = state(host).dirty
    with pytest.raises(RuntimeError), gate.mutation(host):
        raise RuntimeError("body failed")
    assert state(host).dirty == dirty + 1 > state(host).processed
    assert alarm.scheduled(host) is not None
    assert MutationTicket.objects.count() == 0


def test_mutation__crash_before_prearm_changes_nothing(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    dirty = state(host).dirty
    with (
        failpoints.installed(failpoints.raise_at("maintenance:dirty:before")),
        pytest.raises(FailpointError),
        gate.mutation(host),
    ):
        pass  # pragma: no cover
    assert state(host).dirty == dirty
    assert alarm.scheduled(host) is None
    assert MutationTicket.objects.count() == 0


@pytest.mark.parametrize(
    "location",
    ["maintenance:dirty:after", "maintenance:mutation:armed", "maintenance:mutation:finished"],
)
def test_mutation__crash_after_prearm_leaves_dirty_and_armed(
    host: Host, clock: FakeClock, location: str
) -> None:
    caught_up(host)
    dirty = state(host).dirty
    body: list[str] = []
    with (
        failpoints.installed(failpoints.raise_at(location)),
        pytest.raises(FailpointError),
        gate.mutation(host),
    ):
        body.append("ran")
    assert body == ([] if location != "maintenance:mutation:finished" else ["ran"])
    after = state(host)
    assert after.dirty == dirty + 1 > after.processed
    assert alarm.scheduled(host) is not None
    assert MutationTicket.objects.count() == 0


def test_mutation__process_that_never_returns_leaves_a_ticket_that_expires(
    host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    dirty = state(host).dirty
    manager = gate.mutation(host)
    manager.__enter__()  # the process "dies" inside the body: the block never exits
    try:
        after = state(host)
        assert after.dirty == dirty + 1 > after.processed
        assert alarm.scheduled(host) == clock.now() + MIN
        assert gate.snapshot(host, lambda active: active) == 1
        assert gate.active_lanes(host) == {NATIVE}
        clock.advance(seconds=60)
        assert gate.snapshot(host, lambda active: active) == 0
        assert gate.active_lanes(host) == frozenset()
    finally:
        gate._mutation_lanes.set(None)


def test_mutation__host_lanes_reach_revision_two_through_record_progress(
    host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    dirty = state(host).dirty
    with gate.mutation(host, invalidates_recovery=False, lanes=("projection-outbox",)):
        assert MutationTicket.objects.get().lanes == ["projection-outbox"]
        with gate.transaction(host) as tx:
            fact(host, clock)
            tx.record_progress()
    row = lane(host, "projection-outbox")
    assert row.revision == 2
    assert state(host).dirty == dirty  # no native enrollment: no generation advance


def test_mutation__host_lanes_are_released_before_finished(host: Host, clock: FakeClock) -> None:
    seen: list[list[str]] = []

    def look(name: str) -> None:
        if name == "maintenance:mutation:finished":
            seen.append(MutationTicket.objects.get().lanes)

    with failpoints.installed(look), gate.mutation(host, lanes=("outbox",)):
        assert sorted(MutationTicket.objects.get().lanes) == [NATIVE, "outbox"]
    assert seen == [[NATIVE]]


def test_mutation__native_source_does_not_advance_the_generation(
    host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    dirty = state(host).dirty
    with gate.native_source(), gate.mutation(host):
        pass
    assert state(host).dirty == dirty
    assert lane(host, NATIVE).due_at == clock.now()


def test_mutation__publication_lane_enrolled_only_when_required(
    host: Host, clock: FakeClock
) -> None:
    with gate.mutation(host):
        assert MutationTicket.objects.get().lanes == [NATIVE]
    previous = registry.install_publication(lambda *a: None)
    try:
        with gate.mutation(host):
            assert MutationTicket.objects.get().lanes == [NATIVE, PUBLICATION]
        assert lane(host, PUBLICATION).due_at == clock.now()
    finally:
        registry.install_publication(previous)


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lane_id", ["", "x" * 257, "agent:custom", "has space", "ümlaut", None, 12]
)
def test_bad_input__lane_ids(host: Host, clock: FakeClock, lane_id: object) -> None:
    with pytest.raises(InvalidLaneId):
        gate.schedule(host, lane_id, clock.now())  # type: ignore[arg-type]
    with pytest.raises(InvalidLaneId), gate.transaction(host) as tx:
        tx.schedule(lane_id, clock.now())  # type: ignore[arg-type]
    with pytest.raises(InvalidLaneId), gate.mutation(host, lanes=(lane_id,)):  # type: ignore[arg-type]
        pass  # pragma: no cover
    assert MaintenanceState.objects.count() == 0
    assert DueLane.objects.count() == 0
    assert MutationTicket.objects.count() == 0


def test_bad_input__a_256_character_lane_id_is_fine(host: Host, clock: FakeClock) -> None:
    gate.schedule(host, "x" * 256, clock.now())
    assert DueLane.objects.filter(lane="x" * 256).exists()


@pytest.mark.parametrize(
    "due_at", [None, "2030-01-01T00:00:00Z", float("inf"), float("nan"), 1_700_000_000]
)
def test_bad_input__deadlines(host: Host, clock: FakeClock, due_at: object) -> None:
    with pytest.raises(InvalidDeadline):
        gate.schedule(host, "outbox", due_at)  # type: ignore[arg-type]
    assert DueLane.objects.count() == 0


def test_bad_input__naive_deadline(host: Host, clock: FakeClock) -> None:
    with pytest.raises(InvalidDeadline, match="naive"):
        gate.schedule(host, "outbox", clock.now().replace(tzinfo=None))
    assert DueLane.objects.count() == 0


@pytest.mark.parametrize("cursor", [-1, True, 1.5, "7", 10**600])
def test_bad_input__progress_cursors(host: Host, clock: FakeClock, cursor: object) -> None:
    with pytest.raises(ValueError, match="progress cursor"):
        gate.schedule(host, "outbox", clock.now(), progress_cursor=cursor)  # type: ignore[arg-type]
    assert DueLane.objects.count() == 0


def test_bad_input__unknown_hosts(db: None, clock: FakeClock) -> None:
    for ref in ("no-such-host", 424242, Host(key="unsaved")):
        with pytest.raises(HostNotFound):
            gate.schedule(ref, "outbox", clock.now())
        with pytest.raises(HostNotFound), gate.transaction(ref):
            pass  # pragma: no cover
        with pytest.raises(HostNotFound), gate.mutation(ref):
            pass  # pragma: no cover
    assert MaintenanceState.objects.count() == 0
    assert MutationTicket.objects.count() == 0
    assert Schedule.objects.count() == 0


def test_bad_input__lanes_given_as_a_string(host: Host, clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="not a string"), gate.mutation(host, lanes="outbox"):
        pass  # pragma: no cover
    with pytest.raises(ValueError, match="not a string"), gate.transaction(host) as tx:
        tx.record_progress("outbox")
    assert MutationTicket.objects.count() == 0
