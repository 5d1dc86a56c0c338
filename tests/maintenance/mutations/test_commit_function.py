"""The commit function (Note [The commit function]): the same rows as the Python path.

Equivalence runs seeded sequences of gate operations, with pass-like changes in between, on
two hosts at once, one through each path, and compares state, lanes, slot and ``Host.alarm``
after every step. The rest covers rollback, concurrent producers, errors, failpoints and the
function's lock order, seen from a second connection.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django_q.models import Schedule

from durable_agent.errors import AlarmError, HostNotFound, RevisionConflict
from durable_agent.maintenance import (
    alarm,
    commit_function,
    failpoints,
    gate,
    run_alarm_transaction,
)
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.maintenance.types import EPOCH
from durable_agent.models import AlarmAudit, DueLane, Host, MaintenanceState
from durable_agent.testing import FakeClock
from tests.maintenance.helpers import caught_up
from tests.threads import run_threads

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]
S = timedelta(seconds=1)
LANES = ("a", "b", "c")


@pytest.fixture(autouse=True)
def _wall_is_the_clock(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A created state row's ``updated_at`` (``auto_now``) reads the same time on both paths."""
    from django.utils import timezone

    monkeypatch.setattr(timezone, "now", clock.now)


@contextmanager
def python_path() -> Iterator[None]:
    saved, commit_function.enabled = commit_function.enabled, False
    try:
        yield
    finally:
        commit_function.enabled = saved


def calls(captured: CaptureQueriesContext) -> int:
    return sum("durable_agent_commit_intent" in q["sql"] for q in captured.captured_queries)


def rows(host: Host) -> dict[str, Any]:
    """Everything the commit writes for ``host``, without its ids."""
    host.refresh_from_db()
    state = MaintenanceState.objects.filter(host=host).values().first()
    if state is not None:
        del state["host_id"]
    lanes = list(DueLane.objects.filter(host=host).order_by("lane").values())
    for row in lanes:
        del row["id"], row["host_id"]
    slot = Schedule.objects.filter(pk=host.alarm_id).values().first()
    if slot is not None:
        assert slot.pop("name") == f"durable_agent:host:{host.pk}"
        assert slot.pop("args") == repr(host.pk)
        del slot["id"]
    count = Schedule.objects.filter(name=f"durable_agent:host:{host.pk}").count()
    return {"state": state, "lanes": lanes, "slot": slot, "slots": count}


Step = Callable[[Host], None]


def gate_step(rng: random.Random, clock: FakeClock) -> Step:
    ops: list[tuple[str, Any, Any]] = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.5:
            lanes = rng.sample([NATIVE, *LANES], rng.randint(0, 3))
            ops.append(("progress", lanes, rng.random() < 0.25))
        else:
            due = clock.now() + rng.randint(-10, 120) * S + rng.randint(0, 999) * S / 1000
            ops.append(("schedule", rng.choice(LANES), due))

    def step(host: Host) -> None:
        with gate.transaction(host) as tx:
            AlarmAudit.objects.create(host=host, actor="fact", generation=0, at=clock.now())
            for kind, first, second in ops:
                if kind == "schedule":
                    tx.schedule(first, second)
                elif second:
                    with gate.native_source():
                        tx.record_progress(first)
                else:
                    tx.record_progress(first)

    return step


def pass_step(rng: random.Random, clock: FakeClock) -> Step:
    """What a pass or a repair leaves behind, through the Python path on both hosts."""
    kind = rng.choice(["caught up", "park", "backoff", "idle", "disarm", "complete later"])
    lane_id = rng.choice(LANES)
    claims = rng.randint(1, 8)

    def fn(tx) -> None:
        state, queue, checkpoint = tx.state, tx.queue, tx.checkpoint
        if kind == "caught up":
            state.processed = state.dirty
            queue.checkpoint_native(None)
            checkpoint.cancel()
        elif kind == "park":
            queue.dirty(lane_id, clock.now())
            for _ in range(claims):
                row = queue.find(lane_id)
                queue.claim(row, max(row.due_at, row.floor))
        elif kind == "backoff":
            state.retry_generation = state.dirty
            state.retry_not_before = clock.now() + 5 * S
            state.retry_native_only = True
            state.retry_stalls = 2
        elif kind == "idle" and queue.find(lane_id) is not None:
            queue.complete(queue.find(lane_id), None)
        elif kind == "disarm":
            checkpoint.cancel()
        elif kind == "complete later" and queue.find(lane_id) is not None:
            queue.complete(queue.find(lane_id), clock.now() + 300 * S)
            checkpoint.at(clock.now() + 300 * S)

    return lambda host: run_alarm_transaction(host, "test pass step", fn)


@pytest.mark.parametrize("seed", range(12))
def test_equivalence__random_sequences_write_the_same_rows(seed: int, clock: FakeClock) -> None:
    rng = random.Random(seed)
    python_host = Host.objects.create(key=f"py-{seed}")
    server_host = Host.objects.create(key=f"sql-{seed}")
    used = 0
    for _ in range(25):
        choice = rng.random()
        if choice < 0.65:
            step = gate_step(rng, clock)
            with python_path():
                step(python_host)
            with CaptureQueriesContext(connection) as captured:
                step(server_host)
            used += calls(captured)
        elif choice < 0.85:
            step = pass_step(rng, clock)
            step(python_host)
            step(server_host)
        else:
            clock.advance(seconds=rng.randint(1, 90_000) / 1000)
        assert rows(server_host) == rows(python_host)
    assert used > 0


@pytest.mark.parametrize(
    "case", ["first wake-up", "settled host", "earlier", "coalesces", "parked lane", "floor"]
)
def test_equivalence__the_named_cases(case: str, clock: FakeClock) -> None:
    def prepare(host: Host) -> None:
        if case == "first wake-up":
            return
        caught_up(host)
        if case == "earlier":
            gate.schedule(host, "a", clock.now() + 3600 * S)
        elif case == "coalesces":
            gate.schedule(host, "a", clock.now() + 1 * S)
        elif case in ("parked lane", "floor"):

            def park(tx) -> None:
                queue = tx.queue
                queue.dirty("a", clock.now())
                for _ in range(8 if case == "parked lane" else 2):
                    row = queue.find("a")
                    queue.claim(row, max(row.due_at, row.floor))

            run_alarm_transaction(host, "t", park)

    def commit(host: Host) -> None:
        with gate.transaction(host) as tx:
            tx.record_progress([NATIVE])
            tx.schedule("a", clock.now() + 10 * S)

    python_host, server_host = Host.objects.create(key="py"), Host.objects.create(key="sql")
    with python_path():
        prepare(python_host)
        commit(python_host)
    prepare(server_host)
    with CaptureQueriesContext(connection) as captured:
        commit(server_host)
    assert calls(captured) == 1
    assert rows(server_host) == rows(python_host)


def test_fold__unusual_intent_takes_the_python_path(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    with CaptureQueriesContext(connection) as captured, gate.transaction(host) as tx:
        tx.schedule("a", clock.now(), progress_cursor=7)
    assert calls(captured) == 0
    with CaptureQueriesContext(connection) as captured, gate.transaction(host) as tx:
        tx.schedule("a", EPOCH - S)
    assert calls(captured) == 0
    assert DueLane.objects.get(host=host, lane="a").progress_key == "7"


def test_commit__one_round_trip_for_the_alarm_transaction(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    with CaptureQueriesContext(connection) as captured, gate.transaction(host) as tx:
        tx.record_progress([NATIVE])
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    assert len(statements) == 1, statements
    assert alarm.scheduled(host) == clock.now() + timedelta(milliseconds=50)


def test_commit__failpoint_after_the_lane_writes_rolls_back(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    before = rows(host)
    seen: list[str] = []
    with failpoints.installed(failpoints.recorder(seen)), gate.transaction(host) as tx:
        tx.record_progress(["a"])
    assert seen == ["maintenance:queue:flush"]
    after = rows(host)
    with (
        pytest.raises(AlarmError) as info,
        failpoints.installed(failpoints.raise_at("maintenance:queue:flush")),
        gate.transaction(host) as tx,
    ):
        AlarmAudit.objects.create(host=host, actor="fact", generation=0, at=clock.now())
        tx.record_progress([NATIVE])
    assert str(info.value) == (
        "commit maintenance source intent: failpoint maintenance:queue:flush"
    )
    assert isinstance(info.value.__cause__, failpoints.FailpointError)
    assert rows(host) == after != before
    assert AlarmAudit.objects.count() == 0


def test_commit__a_vanished_host_is_host_not_found(clock: FakeClock) -> None:
    for use_python in (True, False):
        host = Host.objects.create(key=f"gone-{use_python}")
        Host.objects.filter(pk=host.pk).delete()
        with (
            python_path() if use_python else _nothing(),
            pytest.raises(HostNotFound, match=f"No host with id {host.pk}"),
            gate.transaction(host) as tx,
        ):
            tx.record_progress([NATIVE])


@contextmanager
def _nothing() -> Iterator[None]:
    yield


# -- real transactions ---------------------------------------------------------------------


def other_connection() -> psycopg.Connection[Any]:
    settings = connection.settings_dict
    return psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"] or "postgres",
        dbname=settings["NAME"],
        autocommit=False,
    )


def wait_until_blocked(other: psycopg.Connection[Any], pid_box: list[int]) -> None:
    """Wait (bounded) until the backend in ``pid_box`` waits on a lock."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if pid_box:
            with other.cursor() as cursor:
                cursor.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid_box[0]]
                )
                found = cursor.fetchone()
            if found is not None and found[0] == "Lock":
                return
        time.sleep(0.01)
    raise AssertionError("the commit never waited on the lock")


def in_thread(fn: Callable[[list[int]], None]) -> tuple[threading.Thread, list[int], list[Any]]:
    """Start ``fn(pid_box)`` in a thread; it appends its backend pid to ``pid_box``."""
    pid_box: list[int] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn(pid_box)
        except BaseException as exc:  # collected for the test
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, pid_box, errors


def committing(
    host: Host, clock: FakeClock, ops: Callable[[Any], None]
) -> Callable[[list[int]], None]:
    def run(pid_box: list[int]) -> None:
        with gate.transaction(host) as tx:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid_box.append(cursor.fetchone()[0])
            ops(tx)

    return run


@pytest.mark.django_db(transaction=True)
def test_lock_order__nothing_before_the_state_row(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    gate.schedule(host, "a", clock.now() + 3600 * S)
    with other_connection() as other:
        with other.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM durable_agent_maintenancestate WHERE host_id = %s FOR UPDATE",
                [host.pk],
            )
        thread, pid, errors = in_thread(
            committing(host, clock, lambda tx: tx.record_progress([NATIVE, "a"]))
        )
        wait_until_blocked(other, pid)
        with other.cursor() as cursor:  # lanes and slot are free while it waits
            cursor.execute(
                "SELECT 1 FROM durable_agent_duelane WHERE host_id = %s FOR UPDATE NOWAIT",
                [host.pk],
            )
            cursor.execute(
                "SELECT 1 FROM django_q_schedule WHERE id = %s FOR UPDATE NOWAIT",
                [Host.objects.get(pk=host.pk).alarm_id],
            )
        other.rollback()
        thread.join(timeout=60)
    assert not errors, errors
    assert alarm.scheduled(host) == clock.now() + timedelta(milliseconds=50)


@pytest.mark.django_db(transaction=True)
def test_lock_order__state_and_lanes_before_the_slot(host: Host, clock: FakeClock) -> None:
    caught_up(host)
    gate.schedule(host, "a", clock.now() + 3600 * S)
    slot_id = Host.objects.get(pk=host.pk).alarm_id
    with other_connection() as other:
        with other.cursor() as cursor:
            cursor.execute("SELECT 1 FROM django_q_schedule WHERE id = %s FOR UPDATE", [slot_id])
        thread, pid, errors = in_thread(
            committing(host, clock, lambda tx: tx.record_progress([NATIVE, "a"]))
        )
        wait_until_blocked(other, pid)
        for sql in (
            "SELECT 1 FROM durable_agent_maintenancestate WHERE host_id = %s FOR UPDATE NOWAIT",
            "SELECT 1 FROM durable_agent_duelane WHERE host_id = %s FOR UPDATE NOWAIT",
        ):
            with other.cursor() as cursor, pytest.raises(psycopg.errors.LockNotAvailable):
                cursor.execute("SAVEPOINT probe")
                try:
                    cursor.execute(sql, [host.pk])
                finally:
                    cursor.execute("ROLLBACK TO SAVEPOINT probe")
        other.rollback()
        thread.join(timeout=60)
    assert not errors, errors
    assert alarm.scheduled(host) == clock.now() + timedelta(milliseconds=50)


@pytest.mark.django_db(transaction=True)
def test_insert_race__a_lane_inserted_behind_the_lock_is_a_revision_conflict(
    host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    with other_connection() as other:
        with other.cursor() as cursor:  # bypasses the state row lock: a broken writer
            cursor.execute(
                "INSERT INTO durable_agent_duelane (host_id, lane, revision, due_at, stalls, "
                "state, reported) VALUES (%s, 'late', 5, NULL, 0, 'idle', false)",
                [host.pk],
            )
        thread, pid, errors = in_thread(
            committing(host, clock, lambda tx: tx.schedule("late", clock.now() + S))
        )
        wait_until_blocked(other, pid)
        other.commit()
        thread.join(timeout=60)
    [error] = errors
    assert isinstance(error, RevisionConflict)
    assert error.context["lane"] == "late"
    assert DueLane.objects.get(host=host, lane="late").revision == 5
    assert alarm.scheduled(host) is None


@pytest.mark.django_db(transaction=True)
def test_rollback__a_failed_commit_after_the_call_leaves_nothing(
    host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    before = rows(host)
    with pytest.raises(AlarmError, match="could not commit"), gate.transaction(host) as tx:
        # A deferred foreign key: it fails at COMMIT, after the function ran.
        AlarmAudit.objects.create(host_id=host.pk + 10_000, actor="x", generation=0, at=clock.now())
        tx.record_progress([NATIVE])
    assert rows(host) == before
    assert alarm.scheduled(host) is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fresh", [True, False])
def test_concurrent_producers__every_generation_counted_one_slot(
    clock: FakeClock, fresh: bool
) -> None:
    host = Host.objects.create(key="busy")
    if not fresh:
        caught_up(host)
    start = MaintenanceState.objects.filter(host=host).values_list("dirty", flat=True).first()
    threads, per_thread = 6, 10

    def work(i: int) -> None:
        for j in range(per_thread):
            with gate.transaction(host) as tx:
                AlarmAudit.objects.create(host=host, actor=f"{i}", generation=j, at=clock.now())
                tx.record_progress([NATIVE, f"lane-{i % 2}"])
                tx.schedule("later", clock.now() + (j + 1) * S)

    run_threads(work, threads)
    state = MaintenanceState.objects.get(host=host)
    assert state.dirty == (start if start is not None else 1) + threads * per_thread
    assert DueLane.objects.get(host=host, lane=NATIVE).revision == threads * per_thread
    assert DueLane.objects.get(host=host, lane="lane-0").revision == (threads // 2) * per_thread
    assert Schedule.objects.filter(name=f"durable_agent:host:{host.pk}").count() == 1
    assert alarm.scheduled(host) == clock.now() + timedelta(milliseconds=50)
    assert AlarmAudit.objects.filter(host=host).count() == threads * per_thread
