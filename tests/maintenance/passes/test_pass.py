"""The maintenance pass against upstream's rules, driven by the scripted runtime."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from durable_agent import lanes
from durable_agent.errors import AlarmError, LaneNotRegistered
from durable_agent.maintenance import (
    alarm,
    ensure_alarm,
    failpoints,
    gate,
    run_alarm_transaction,
    run_pass,
)
from durable_agent.maintenance.lane_ids import NATIVE, RECOVERY_EVENTS
from durable_agent.maintenance.types import EPOCH
from durable_agent.models import (
    BindingRetry,
    DueLane,
    Host,
    MaintenanceState,
    PassRecord,
    RecoveryEvent,
    RecoveryFault,
    WorkCursor,
)
from durable_agent.runtime import Blocked, RecoveryReport, RecoverySweep
from durable_agent.signals import recovery_fault
from durable_agent.testing import FakeClock, ScriptedRuntime, fake_random
from tests.maintenance.helpers import caught_up, drain, generations

pytestmark = pytest.mark.django_db
S = timedelta(seconds=1)
MS = timedelta(milliseconds=1)


def state_of(host: Host) -> MaintenanceState:
    return MaintenanceState.objects.get(host=host)


def native(host: Host) -> DueLane:
    return DueLane.objects.get(host=host, lane=NATIVE)


# -- settle, acknowledge, clear ------------------------------------------------------------


def test_pass__a_settled_head_is_acknowledged_and_the_slot_cleared(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    item = runtime.submit(host, "t1")
    report = run_pass(host)
    assert item.settled
    assert (report.phase, report.settled, report.alarm, report.nonterminal) == (
        "actionable",
        1,
        "cleared",
        0,
    )
    dirty, processed = generations(host)
    assert dirty == processed == report.generation
    assert alarm.scheduled(host) is None
    assert native(host).state == "idle"


def test_pass__caught_up_when_nothing_is_dirty(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    runtime.submit(host, "t1")
    run_pass(host)
    runtime.calls.clear()
    report = run_pass(host)
    assert (report.phase, report.alarm) == ("caught-up", "cleared")
    assert runtime.calls == []  # no ledger scan, no recovery, no attempt


def statements(queries: CaptureQueriesContext) -> tuple[list[str], int]:
    """The statements captured, without the savepoints the test's own transaction adds and
    without the pass-record history trim (about every 20th pass of a host, by record id:
    ``write_record``), and the number of transactions (savepoints) they ran in."""
    sql = [q["sql"] for q in queries.captured_queries]
    transactions = sum(1 for q in sql if q.startswith("SAVEPOINT"))
    trim = ('SELECT "durable_agent_passrecord"."id"', 'DELETE FROM "durable_agent_passrecord"')
    return [q for q in sql if "SAVEPOINT" not in q and not q.startswith(trim)], transactions


@pytest.mark.parametrize("ledger", [10, 1000])
@pytest.mark.parametrize("armed", [False, True])
def test_pass__caught_up_path_is_one_transaction_of_at_most_five_statements(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, ledger: int, armed: bool
) -> None:
    for i in range(ledger):  # suspended heads: stable waits the pass acknowledges
        runtime.submit(host, f"t{i}", state="suspended", admit=i == 0)
    run_pass(host)
    assert generations(host)[0] == generations(host)[1]
    if armed:  # a slot that outlived its work (a repair, a duplicate): disarmed exactly once
        alarm.rearm(host, at=clock.now() + S)
    runtime.calls.clear()
    with CaptureQueriesContext(connection) as queries:
        report = run_pass(host)
    assert (report.phase, report.alarm) == ("caught-up", "cleared")
    assert runtime.calls == []
    sql, transactions = statements(queries)
    # Lock the state, read the lanes with the slot, read the tickets, (disarm), record. On
    # PostgreSQL the lock and the reads are one call and the writes one statement (Note [Lock
    # and read in one call], Note [One write statement per alarm transaction]).
    expected = 2 if connection.vendor == "postgresql" else (5 if armed else 4)
    assert (transactions, len(sql)) == (1, expected), "\n".join(sql)
    assert sum(1 for q in sql if 'UPDATE "django_q_schedule"' in q) == int(armed)
    assert not any(q.startswith('UPDATE "durable_agent_maintenancestate"') for q in sql)
    assert alarm.scheduled(host) is None


def test_pass__one_due_wave_runs_in_two_transactions(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    ran: list[str] = []
    lanes.register("outbox", lambda ctx: ran.append(ctx.lane))
    run_pass(host)  # the first pass stores the registry key
    gate.schedule(host, "outbox", clock.now())
    with CaptureQueriesContext(connection) as queries:
        report = run_pass(host)
    assert ran == ["outbox"]
    assert (report.phase, report.alarm) == ("caught-up", "cleared")
    sql, transactions = statements(queries)
    # begin (lock, lanes, tickets, then the lease, the claim and the slot within the lease),
    # then complete + finish + record; on PostgreSQL each transaction's lock and reads are one
    # call (Note [Lock and read in one call]) and its writes, the record's insert among them,
    # one statement (Note [One write statement per alarm transaction]).
    expected = 4 if connection.vendor == "postgresql" else 13
    assert (transactions, len(sql)) == (2, expected), "\n".join(sql)
    assert DueLane.objects.get(host=host, lane="outbox").state == "idle"
    assert alarm.scheduled(host) is None
    assert PassRecord.objects.filter(host=host, phase="caught-up").count() == 1


def test_pass__a_caught_up_pass_of_a_dirty_host_keeps_its_slot_armed(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    # Port decision P12: no path leaves a dirty host with a disarmed slot. A durable native
    # backoff makes the pass caught up while the host is dirty.
    run_pass(host)  # the first pass stores the registry key

    def backoff(tx):  # type: ignore[no-untyped-def]
        state, queue = tx.state, tx.queue
        state.dirty += 1
        state.retry_generation = state.dirty
        state.retry_not_before = clock.now() + 5 * S
        state.retry_native_only = True
        state.retry_stalls = 1
        queue.checkpoint_native(clock.now() + 5 * S)

    run_alarm_transaction(host, "test backoff", backoff)
    report = run_pass(host)
    assert (report.phase, report.alarm) == ("caught-up", "rearmed")
    assert alarm.scheduled(host) == clock.now() + 5 * S


def test_pass__fifo_one_attempt_per_pass_on_a_single_thread_host(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host = Host.objects.create(key="single", single_thread=True)
    first = runtime.submit(host, "t1")
    second = runtime.submit(host, "t1")
    report = run_pass(host)
    assert (first.settled, second.settled) == (True, False)
    assert (report.settled, report.alarm) == (1, "rearmed")
    # Progress: the next pass comes after the base delay, not a backoff.
    assert alarm.scheduled(host) == clock.now() + timedelta(milliseconds=100)
    assert generations(host)[0] > generations(host)[1]
    result = drain(host, clock)
    assert second.settled
    assert result.errors == []
    assert alarm.scheduled(host) is None


def test_pass__round_robin_selection_and_two_slots_on_a_shared_host(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    items = {t: runtime.submit(host, t) for t in ("a", "b", "c")}
    report = run_pass(host)
    assert report.settled == 2
    assert [t for t, i in items.items() if i.settled] == ["a", "b"]
    assert state_of(host).last_served_thread == "b"
    drain(host, clock)
    assert items["c"].settled


def test_pass__round_robin_starts_after_the_last_served_thread(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host = Host.objects.create(key="rr", single_thread=True)
    hangs = {t: runtime.submit(host, t, behaviour="hang") for t in ("a", "b", "c")}
    order = []
    for _ in range(4):
        runtime.calls.clear()
        clock.advance(seconds=70)
        run_pass(host)
        order += [c[1] for c in runtime.calls if c[0] == "process_thread_head"]
    assert order == ["a", "b", "c", "a"]
    assert all(h.attempts >= 1 for h in hangs.values())


def test_pass__one_active_head_per_thread(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    runtime.submit(host, "t1")
    runtime.submit(host, "t1")
    run_pass(host)
    heads = [c for c in runtime.calls if c[0] == "process_thread_head"]
    assert heads == [("process_thread_head", "t1")]


# -- races ---------------------------------------------------------------------------------


def test_pass__a_mutation_racing_the_pass_keeps_dirty_and_armed(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    item = runtime.submit(host, "t1")

    def race(name: str) -> None:
        if name == "maintenance:checkpoint:before":
            with gate.mutation(host):
                pass

    with failpoints.installed(race):
        report = run_pass(host)
    assert item.settled
    dirty, processed = generations(host)
    assert dirty > processed
    assert report.alarm == "rearmed"
    assert alarm.scheduled(host) is not None
    drain(host, clock)
    assert generations(host)[0] == generations(host)[1]


def test_pass__a_live_mutation_ticket_blocks_acknowledgement(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    runtime.submit(host, "t1")
    manager = gate.mutation(host, invalidates_recovery=False)
    manager.__enter__()  # a producer between prearm and commit (its process may be dead)
    try:
        report = run_pass(host)
        dirty, processed = generations(host)
        assert dirty > processed
        assert report.alarm == "rearmed"
        clock.advance(seconds=61)  # the ticket expires
        result = drain(host, clock)
        assert result.errors == []
        assert generations(host)[0] == generations(host)[1]
    finally:
        gate._mutation_lanes.set(None)


# -- backoff -------------------------------------------------------------------------------


@pytest.mark.parametrize(("jitter", "expected_ms"), [(0.0, 100), (0.5, 150), (0.999, 200)])
def test_pass__no_progress_backs_off_durably(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, jitter: float, expected_ms: int
) -> None:
    runtime.submit(host, "t1", behaviour="hang")
    with fake_random(jitter):
        report = run_pass(host)
    state = state_of(host)
    # started.stalls = 1 (the begin claim): b = min(cap, 100 * 2^1) = 200, jittered to [100, 200].
    assert state.retry_generation == state.dirty
    assert state.retry_not_before == clock.now() + expected_ms * MS
    assert (state.retry_stalls, state.retry_native_only) == (2, True)
    assert state.dirty > state.processed
    # The native claim floor (1 s after the first claim) bounds the next pass.
    assert report.alarm == "rearmed"
    assert alarm.scheduled(host) == clock.now() + 1 * S


def test_pass__backoff_is_capped(host: Host, clock: FakeClock, runtime: ScriptedRuntime) -> None:
    runtime.submit(host, "t1", behaviour="hang")
    stalls = []
    with fake_random(0.999):
        for _ in range(6):
            clock.advance(seconds=61)
            run_pass(host)
            state = state_of(host)
            stalls.append((state.retry_not_before - clock.now()) / MS)
    # b = min(5000, 100 * 2^s) for s = 1..6 -> 200, 400, 800, 1600, 3200, 5000 (jitter ~1)
    assert [round(v, -1) for v in stalls] == [200, 400, 800, 1600, 3200, 5000]


def test_pass__the_native_lane_parks_after_eight_claims_without_progress(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    runtime.submit(host, "t1", behaviour="hang")
    for _ in range(8):
        clock.advance(seconds=61)
        run_pass(host)
    row = native(host)
    assert (row.state, row.stalls) == ("parked", 8)
    assert row.due_at == clock.now() + 3600 * S
    assert alarm.scheduled(host) == row.due_at
    parked = [r for r in caplog.records if "parked after 8 attempts" in r.getMessage()]
    assert len(parked) == 1
    assert parked[0].getMessage().endswith("; retrying after 1 h")
    run_pass(host)
    assert len([r for r in caplog.records if "parked after 8" in r.getMessage()]) == 1


# -- lanes ---------------------------------------------------------------------------------


def test_lane__a_due_host_lane_runs_and_goes_idle(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    ran = []
    lanes.register("outbox", lambda ctx: ran.append(ctx.lane))
    caught_up(host)
    gate.schedule(host, "outbox", clock.now() + 5 * S)
    assert alarm.scheduled(host) == clock.now() + 5 * S
    result = drain(host, clock)
    assert ran == ["outbox"]
    assert result.errors == []
    row = DueLane.objects.get(host=host, lane="outbox")
    assert (row.state, row.due_at, row.stalls) == ("idle", None, 0)


def test_lane__a_lane_rearming_without_progress_parks_after_eight_claims(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []

    def again(ctx):
        calls.append(ctx.now())
        return ctx.now()  # always more to do, never progress

    lanes.register("outbox", again)
    caught_up(host)
    gate.schedule(host, "outbox", clock.now())
    floors = []
    for _ in range(8):
        ran_at = drain_once(host, clock)
        row = DueLane.objects.get(host=host, lane="outbox")
        floors.append(round((row.not_before - ran_at) / S))
    assert len(calls) == 8
    assert floors[:7] == [1, 2, 4, 8, 16, 32, 60]
    row = DueLane.objects.get(host=host, lane="outbox")
    assert (row.state, row.stalls, row.reported) == ("parked", 8, True)
    assert alarm.scheduled(host) == row.due_at
    notices = [r for r in caplog.records if "parked after 8 attempts" in r.getMessage()]
    assert len(notices) == 1
    assert notices[0].lane == "host"
    # Source progress replenishes the budget.
    gate.schedule(host, "outbox", clock.now(), progress_cursor=1)
    assert DueLane.objects.get(host=host, lane="outbox").state == "pending"


def drain_once(host: Host, clock: FakeClock) -> object:
    slot = alarm.scheduled(host)
    assert slot is not None
    ran_at = clock.set(max(slot, clock.now()))
    run_pass(host, deadline=slot, guard=True)
    return ran_at


def test_lane__a_failing_lane_backs_off_durably_and_the_pass_reraises(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    def broken(ctx):
        raise ValueError("lane exploded")

    lanes.register("outbox", broken)
    caught_up(host)
    gate.schedule(host, "outbox", clock.now())
    with fake_random(0.0), pytest.raises(ValueError, match="lane exploded"):
        run_pass(host)
    row = DueLane.objects.get(host=host, lane="outbox")
    assert row.stalls == 1
    assert row.due_at == clock.now() + 1 * S  # the claim floor bounds the backoff
    assert alarm.scheduled(host) == row.due_at
    record = PassRecord.objects.filter(host=host).first()
    assert record.phase == "failed"
    assert "lane exploded" in record.error


def test_lane__no_handler_fails_the_pass(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    caught_up(host)
    gate.schedule(host, "orphan", clock.now())
    with pytest.raises(LaneNotRegistered, match="No handler registered for scheduled lane: orphan"):
        run_pass(host)
    assert alarm.scheduled(host) is not None


def test_lane__an_overrun_fails_the_pass(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    def slow(ctx):
        clock.advance(ms=20)

    lanes.register("slow", slow, allowance_ms=10)
    caught_up(host)
    gate.schedule(host, "slow", clock.now())
    with pytest.raises(AlarmError, match="exceeded its allowance"):
        run_pass(host)
    assert DueLane.objects.get(host=host, lane="slow").due_at is not None


def test_lane__an_inline_wave_sees_cancelled_after_its_allowance_and_a_second(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    seen: list[bool] = []

    def slow(ctx):  # type: ignore[no-untyped-def]
        seen.append(ctx.cancelled())
        clock.advance(ms=1_010)
        seen.append(ctx.cancelled())
        clock.advance(ms=1)
        seen.append(ctx.cancelled())

    lanes.register("slow", slow, allowance_ms=10)
    run_pass(host)  # the first pass stores the registry key: the next is caught up
    gate.schedule(host, "slow", clock.now())
    with pytest.raises(AlarmError, match="exceeded its allowance"):
        run_pass(host)  # its one wave runs on the pass's thread (the short path)
    assert seen == [False, True, True]


def test_lane__producing_lanes_are_not_run(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    ran = []
    lanes.register("outbox", lambda ctx: ran.append(1))
    caught_up(host)
    manager = gate.mutation(host, invalidates_recovery=False, lanes=("outbox",))
    manager.__enter__()
    try:
        run_pass(host)
        assert ran == []
    finally:
        gate._mutation_lanes.set(None)


def test_lane__after_native_lanes_rotate(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    ran: list[str] = []
    for name in ("a-lane", "b-lane", "c-lane"):
        lanes.register(name, lambda ctx: ran.append(ctx.lane), phase="after-native")
    caught_up(host)
    for name in ("a-lane", "b-lane", "c-lane"):
        gate.schedule(host, name, clock.now())
    run_pass(host)
    assert ran == ["a-lane", "b-lane", "c-lane"]
    assert state_of(host).last_after_native_lane == "c-lane"


@pytest.mark.parametrize("bad", [0, 300_001, "10", True])
def test_lane__bad_registrations(bad: object) -> None:
    with pytest.raises(ValueError, match="allowance"):
        lanes.register("outbox", lambda ctx: None, allowance_ms=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reserved"):
        lanes.register("agent:mine", lambda ctx: None)
    with pytest.raises(ValueError, match="phase"):
        lanes.register("outbox", lambda ctx: None, phase="later")  # type: ignore[arg-type]


# -- bindings ------------------------------------------------------------------------------


def test_binding__a_parked_head_keeps_no_alarm_until_the_registry_changes(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    item = runtime.submit(host, "t1", behaviour="binding")
    report = run_pass(host)
    assert report.alarm == "cleared"
    assert alarm.scheduled(host) is None
    retry = BindingRetry.objects.get(host=host)
    assert (retry.thread, retry.submission, retry.registry_key) == (
        "t1",
        item.submission,
        "registry-1",
    )
    logs = [
        r for r in caplog.records if "parked until its agent binding registry" in r.getMessage()
    ]
    assert len(logs) == 1
    # Unrelated work and redelivered alarms do not retry it.
    runtime.submit(host, "t2")
    drain(host, clock)
    assert item.attempts == 1
    assert BindingRetry.objects.filter(host=host).count() == 1
    # A registry change (a deploy) opens one native opportunity.
    item.behaviour = "settle"
    runtime.registry_key = "registry-2"
    assert ensure_alarm(host) is not None
    assert BindingRetry.objects.count() == 0
    drain(host, clock)
    assert item.settled
    assert alarm.scheduled(host) is None


def test_binding__an_unchanged_registry_key_keeps_it_dormant(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    runtime.submit(host, "t1", behaviour="binding")
    run_pass(host)
    dirty = generations(host)[0]
    assert ensure_alarm(host) is None
    assert generations(host)[0] == dirty


# -- recovery ------------------------------------------------------------------------------


def test_recovery__cursor_resumes_after_a_crash_mid_page(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    item = runtime.submit(host, "t1")
    report = RecoveryReport("t1", item.submission, "ApplyInput", "repaired")
    runtime.script_recovery(
        host,
        "t1",
        RecoverySweep(reports=(report,), cursor="p1"),
        RecoverySweep(reports=(report,), cursor="p2"),
        RecoverySweep(reports=(report,)),
    )
    crash = failpoints.raise_at("maintenance:recovery-status:after", times=1)
    hits = []

    def second_page(name: str) -> None:
        if name == "maintenance:recovery-status:after":
            hits.append(name)
            if len(hits) == 2:
                crash(name)

    with failpoints.installed(second_page), pytest.raises(failpoints.FailpointError):
        run_pass(host)
    assert WorkCursor.objects.get(host=host, thread="t1").cursor == "p1"
    assert not item.settled
    assert alarm.scheduled(host) is not None
    drain(host, clock)
    cursors = [c[2] for c in runtime.calls if c[0] == "run_recovery"]
    assert cursors[:3] == ["None", "p1", "p1"]
    assert not WorkCursor.objects.filter(host=host).exists()
    assert item.settled


def test_recovery__faults_produce_created_changed_cleared_events_in_order(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    received = []

    def receiver(sender, host, event, **kwargs):
        received.append((event.sequence, event.transition, event.submission))

    recovery_fault.connect(receiver)
    try:
        item = runtime.submit(host, "t1")
        runtime.script_recovery(
            host,
            "t1",
            RecoverySweep(blocked=(Blocked("t1", {"phase": "recovery", "reason": "failure"}),)),
            RecoverySweep(blocked=(Blocked("t1", {"phase": "recovery", "reason": "timeout"}),)),
            RecoverySweep(),
        )
        report = run_pass(host)
        fault = RecoveryFault.objects.get(host=host, thread="t1")
        assert (fault.attempts, fault.retry_at) == (1, clock.now() + 5 * S)
        assert fault.recipients == [item.submission]
        assert report.recovered >= 1
        assert not item.settled  # a faulted thread is never dispatched
        drain(host, clock)
        assert item.settled
        assert received == [
            (1, "created", item.submission),
            (2, "changed", item.submission),
            (3, "cleared", item.submission),
        ]
        state = state_of(host)
        assert (state.recovery_event_sequence, state.recovery_event_acknowledged) == (3, 3)
        assert not RecoveryFault.objects.filter(host=host).exists()
        assert RecoveryEvent.objects.filter(host=host, delivered_at__isnull=False).count() == 3
    finally:
        recovery_fault.disconnect(receiver)


def test_recovery__fault_retry_schedule(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    runtime.submit(host, "t1")
    failure = {"phase": "recovery", "reason": "failure"}
    runtime.script_recovery(host, "t1", *[RecoverySweep(blocked=(Blocked("t1", failure),))] * 6)
    delays = []
    for attempt in range(1, 7):
        for _ in range(30):  # fire until recovery is retried (not before retry_at)
            drain_once(host, clock)
            fault = RecoveryFault.objects.get(host=host, thread="t1")
            if fault.attempts == attempt:
                break
        delays.append(round((fault.retry_at - fault.last_failed_at) / S))
    assert delays == [5, 10, 20, 40, 60, 60]


def test_recovery__a_failing_receiver_is_redelivered_from_the_same_sequence(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    seen = []

    def flaky(sender, host, event, **kwargs):
        seen.append(event.sequence)
        if len(seen) == 1:
            raise RuntimeError("receiver down")

    recovery_fault.connect(flaky)
    try:
        runtime.submit(host, "t1")
        runtime.script_recovery(
            host, "t1", RecoverySweep(blocked=(Blocked("t1", {"reason": "failure"}),))
        )
        result = drain(host, clock)
        assert seen[:2] == [1, 1]
        assert any("receiver down" in str(e) for e in result.errors)
        assert state_of(host).recovery_event_acknowledged >= 1
    finally:
        recovery_fault.disconnect(flaky)


def test_recovery__discovery_pages_of_32_wrap_around(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    for i in range(40):
        runtime.script_recovery(host, f"w{i:02d}", RecoverySweep())
    report = run_pass(host)
    recovered = [c[1] for c in runtime.calls if c[0] == "run_recovery"]
    assert recovered == [f"w{i:02d}" for i in range(32)]
    assert state_of(host).last_recovered_thread == "w31"
    assert report.alarm == "rearmed"  # discovery is pending: more work owners remain
    runtime.calls.clear()
    drain(host, clock)
    recovered = [c[1] for c in runtime.calls if c[0] == "run_recovery"]
    assert recovered[:8] == [f"w{i:02d}" for i in range(32, 40)]
    assert alarm.scheduled(host) is None


def test_recovery__an_aborted_ready_head_is_left_to_recovery(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    item = runtime.submit(host, "t1")
    runtime.abort_intents[item.submission] = clock.now()
    run_pass(host)
    assert ("process_thread_head", "t1") not in runtime.calls
    assert ("run_recovery", "t1", "None") in runtime.calls


# -- yield and deadline --------------------------------------------------------------------


def test_pass__no_attempt_after_the_yield_deadline(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    item = runtime.submit(host, "t1")

    def late(name: str) -> None:
        if name == "maintenance:begin:after":
            clock.advance(minutes=10)

    with failpoints.installed(late):
        report = run_pass(host)
    assert not item.settled
    assert report.alarm == "rearmed"
    drain(host, clock)
    assert item.settled


def test_pass__the_event_deadline_fails_the_pass(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    runtime.submit(host, "t1")

    def very_late(name: str) -> None:
        if name == "maintenance:select:after":
            clock.advance(minutes=15)

    with failpoints.installed(very_late), pytest.raises(AlarmError, match="14 minute deadline"):
        run_pass(host)
    assert alarm.scheduled(host) is not None


# -- lease and guard -----------------------------------------------------------------------


def test_lease__a_held_lease_makes_the_pass_busy_until_it_expires(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    item = runtime.submit(host, "t1")
    MaintenanceState.objects.filter(host=host).update(
        pass_lease_owner="crashed", pass_lease_expires_at=clock.now() + 30 * S
    )
    report = run_pass(host)
    assert report.phase == "busy"
    assert not item.settled
    assert alarm.scheduled(host) <= clock.now() + 30 * S
    clock.advance(seconds=30)
    assert run_pass(host).phase == "actionable"
    assert item.settled
    assert state_of(host).pass_lease_owner is None


def test_guard__a_slot_moved_later_makes_the_delivery_stale(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    item = runtime.submit(host, "t1")
    alarm.rearm(host, at=clock.now() + 10 * MS)
    clock.advance(ms=5)
    report = run_pass(host, deadline=clock.now() - 5 * MS, guard=True)
    assert report.phase == "stale"
    assert not item.settled
    assert PassRecord.objects.count() == 0


def test_guard__nothing_due_is_stale_and_keeps_the_lane_deadline(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    lanes.register("outbox", lambda ctx: None)
    caught_up(host)
    gate.schedule(host, "outbox", clock.now() + 60 * S)
    MaintenanceState.objects.filter(host=host)  # the slot fired early and was disarmed:
    from django_q.models import Schedule

    Schedule.objects.update(repeats=0)
    report = run_pass(host, deadline=clock.now(), guard=True)
    assert report.phase == "stale"
    assert alarm.scheduled(host) == clock.now() + 60 * S


def test_guard__a_due_delivery_runs_and_records_its_lateness(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    item = runtime.submit(host, "t1")
    slot = alarm.scheduled(host)
    clock.set(slot + 250 * MS)
    report = run_pass(host, deadline=slot, guard=True)
    assert item.settled
    assert report.lateness_ms == 250
    record = PassRecord.objects.get(host=host)
    assert (record.phase, record.lateness_ms, record.settled) == ("actionable", 250, 1)


@pytest.mark.parametrize(
    "late",
    [timedelta(days=25), timedelta(days=30 * 365)],  # past 2^31 ms; a rearm into 2000
    ids=["25-days", "30-years"],
)
def test_guard__a_delivery_later_than_32_bits_of_ms_is_recorded(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, late: timedelta
) -> None:
    item = runtime.submit(host, "t1")
    slot = clock.now() - late
    alarm.rearm(host, at=slot, reason="a rearm into the distant past")
    report = run_pass(host, deadline=slot, guard=True)
    assert item.settled
    assert report.lateness_ms == late // MS > 2**31
    record = PassRecord.objects.get(host=host)
    assert (record.phase, record.lateness_ms) == ("actionable", report.lateness_ms)


def test_ensure_alarm__arms_a_dirty_host_and_registers_installed_framework_lanes(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    lanes.install_framework("agent:projection", lambda ctx: None)
    slot = ensure_alarm(host)
    assert slot == clock.now() + 50 * MS
    assert DueLane.objects.get(host=host, lane="agent:projection").due_at == EPOCH
    assert not DueLane.objects.filter(host=host, lane=RECOVERY_EVENTS).exists()


def test_report_parked__logs_once(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    from durable_agent.maintenance.passes import report_parked

    caplog.set_level(logging.ERROR)
    DueLane.objects.create(host=host, lane="stuck", state="parked", stalls=8, due_at=clock.now())
    assert report_parked(host.pk) == 1
    assert report_parked(host.pk) == 0
    assert DueLane.objects.get(host=host, lane="stuck").reported


def test_publication__a_due_publication_runs_before_the_native_step(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    order: list[str] = []
    lanes.install_framework("agent:publication", lambda ctx: order.append("publication"))
    item = runtime.submit(host, "t1", behaviour=lambda s: order.append("attempt") or "completed")
    result = drain(host, clock)
    assert result.errors == []
    assert order[:2] == ["publication", "attempt"]
    assert item.settled
    assert alarm.scheduled(host) is None  # no hot loop: the lane went idle
    assert DueLane.objects.get(host=host, lane="agent:publication").state == "idle"


def test_publication__a_failing_publication_holds_the_native_step(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    def broken(ctx):
        raise RuntimeError("publisher down")

    lanes.install_framework("agent:publication", broken)
    item = runtime.submit(host, "t1")
    with pytest.raises(RuntimeError, match="publisher down"):
        run_pass(host)
    assert not item.settled
    assert alarm.scheduled(host) is not None
    lanes.install_framework("agent:publication", None)
    drain(host, clock)
    assert item.settled


def test_lease__mid_pass_the_slot_is_no_later_than_the_lease(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    runtime.submit(host, "t1", behaviour="hang")
    for _ in range(6):  # push the native claim floor (32 s, then 60 s) past the lease TTL
        clock.advance(seconds=61)
        run_pass(host)
    seen = []

    def look(name: str) -> None:  # what a worker killed here would leave behind
        if name == "maintenance:select:before":
            seen.append((alarm.scheduled(host), state_of(host).pass_lease_expires_at))

    clock.advance(minutes=2)
    with failpoints.installed(look):
        run_pass(host)
    ((slot, lease_end),) = seen
    assert native(host).not_before > lease_end  # the claim floor alone would be too late
    assert slot == lease_end == clock.now() + 30 * S


def test_guard__a_consumed_slot_moves_to_the_next_deadline(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    lanes.register("outbox", lambda ctx: None)
    caught_up(host)
    gate.schedule(host, "outbox", clock.now() + 60 * S)
    alarm.rearm(host, at=clock.now() + 10 * MS)  # an early slot, still armed when it fires
    clock.advance(ms=20)
    report = run_pass(host, deadline=clock.now() - 10 * MS, guard=True)
    assert report.phase == "stale"
    # Not left in the past (it would fire again and again): the next real deadline.
    assert alarm.scheduled(host) == clock.now() - 20 * MS + 60 * S
