"""Note [A thread with nothing to recover is not swept] and the single attempt in the pass's
own thread: what a pass does before a fresh submission's agent starts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import durable_agent
from durable_agent import lanes
from durable_agent.agents import attempts, registry
from durable_agent.agents.runtime import ReferenceRuntime
from durable_agent.maintenance import alarm, failpoints, gate, run_pass
from durable_agent.maintenance.passes import waves
from durable_agent.maintenance.passes.pool import close_thread_pool
from durable_agent.maintenance.store import rows
from durable_agent.models import (
    BindingRetry,
    Host,
    MaintenanceState,
    PassRecord,
    RecoveryFault,
    Submission,
)
from durable_agent.testing import FakeClock

pytestmark = pytest.mark.django_db


@pytest.fixture
def runtime_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(method, thread or submission) of every recovery call the pass makes."""
    seen: list[tuple[str, str]] = []
    run_recovery, read_abort_intent, discover = (
        ReferenceRuntime.run_recovery,
        ReferenceRuntime.read_abort_intent,
        ReferenceRuntime.discover_work_threads,
    )

    def recovery(self: Any, host: Host, thread: str, cursor: str | None) -> Any:
        seen.append(("run_recovery", thread))
        return run_recovery(self, host, thread, cursor)

    def intent(self: Any, host: Host, submission: str) -> Any:
        seen.append(("read_abort_intent", submission))
        return read_abort_intent(self, host, submission)

    def discovery(self: Any, host: Host, after: str | None, limit: int) -> Any:
        seen.append(("discover_work_threads", str(len(calls_of_scan))))
        return discover(self, host, after, limit)

    scan = ReferenceRuntime.scan_nonterminal
    calls_of_scan: list[int] = []

    def scanned(self: Any, host: Host) -> Any:
        items = scan(self, host)
        calls_of_scan.append(len(items))
        seen.append(("scan_nonterminal", str(len(items))))
        return items

    scan_both = ReferenceRuntime.scan_nonterminal_with_generation

    def scanned_with_generation(self: Any, host: Host) -> Any:
        both = scan_both(self, host)
        if both is not None:
            calls_of_scan.append(len(both[0]))
            seen.append(("scan_nonterminal_with_generation", str(len(both[0]))))
        return both

    monkeypatch.setattr(ReferenceRuntime, "run_recovery", recovery)
    monkeypatch.setattr(ReferenceRuntime, "discover_work_threads", discovery)
    monkeypatch.setattr(ReferenceRuntime, "scan_nonterminal", scanned)
    monkeypatch.setattr(
        ReferenceRuntime, "scan_nonterminal_with_generation", scanned_with_generation
    )
    monkeypatch.setattr(ReferenceRuntime, "read_abort_intent", intent)
    return seen


def test_a_fresh_submission_runs_without_a_sweep_discovery_or_abort_intent_read(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any], runtime_calls: list[Any]
) -> None:
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)

    report = run_pass(host)

    assert report.phase == "actionable"
    assert calls == [("echo", 1)]
    # Not even after the checkpoint's scan, which finds the host empty: the reference
    # runtime's discovery finds only scanned submissions (``discovery_within_scan``).
    assert runtime_calls == [
        ("scan_nonterminal", "1"),
        ("scan_nonterminal_with_generation", "0"),
    ]


def test_a_runtime_that_does_not_say_is_asked_discovery_after_an_empty_scan(
    host: Host,
    clock: FakeClock,
    echo: Any,
    calls: list[Any],
    runtime_calls: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Runtime's optional attribute: without it, an empty scan still asks discovery (upstream).
    monkeypatch.delattr(ReferenceRuntime, "discovery_within_scan")
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)

    run_pass(host)

    assert calls == [("echo", 1)]
    assert runtime_calls == [
        ("scan_nonterminal", "1"),
        ("scan_nonterminal_with_generation", "0"),
        ("discover_work_threads", "2"),
    ]


def test_a_thread_with_a_recoverable_submission_is_still_swept_first(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any], runtime_calls: list[Any]
) -> None:
    first = durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    later = durable_agent.submit(host=host, thread="t", agent="echo", payload=2)
    # An abort intent behind the head: recovery settles it, so the thread is swept.
    Submission.objects.filter(pk=later.submission_id).update(abort_requested_at=clock.now())

    run_pass(host)

    assert runtime_calls[:2] == [("scan_nonterminal", "2"), ("discover_work_threads", "1")]
    assert ("run_recovery", "t") in runtime_calls
    assert calls == [("echo", 1)]
    assert Submission.objects.get(pk=first.submission_id).outcome == "completed"
    assert Submission.objects.get(pk=later.submission_id).outcome == "aborted"


def test_a_ready_head_with_an_abort_intent_is_read_and_not_run(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any], runtime_calls: list[Any]
) -> None:
    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    Submission.objects.filter(pk=receipt.submission_id).update(abort_requested_at=clock.now())

    run_pass(host)

    assert ("read_abort_intent", str(receipt.submission_id)) in runtime_calls
    assert calls == []
    assert Submission.objects.get(pk=receipt.submission_id).outcome == "aborted"


@pytest.mark.postgres
@pytest.mark.threads
@pytest.mark.django_db(transaction=True)
class TestWhereTheAttemptRuns:
    @pytest.fixture(autouse=True)
    def _fresh_pool(self) -> Iterator[None]:
        close_thread_pool()
        yield
        close_thread_pool()

    @pytest.fixture
    def where(self) -> list[str]:
        names: list[str] = []

        @registry.agent("where", version="1")
        def where(ctx: Any, payload: Any) -> Any:
            names.append(threading.current_thread().name)
            return payload

        return names

    def test_a_single_attempt_runs_in_the_pass_s_thread(
        self, host: Host, clock: FakeClock, where: list[str]
    ) -> None:
        durable_agent.submit(host=host, thread="t", agent="where", payload=1)

        run_pass(host)

        assert where == [threading.current_thread().name]

    def test_several_attempts_run_on_the_pool(
        self, host: Host, clock: FakeClock, where: list[str]
    ) -> None:
        for thread in ("a", "b"):
            durable_agent.submit(host=host, thread=thread, agent="where", payload=1)

        run_pass(host)

        assert len(where) == 2
        assert all(name.startswith("da-pass") for name in where), where


@pytest.mark.parametrize("unknown", [0, 1, 31, 32, 33, 70])
def test_head_of_skips_any_number_of_unknown_submissions(
    host: Host, clock: FakeClock, echo: Any, unknown: int
) -> None:
    receipts = [
        durable_agent.submit(host=host, thread="t", agent="echo", payload=i)
        for i in range(unknown + 2)
    ]
    ids = [r.submission_id for r in receipts]
    Submission.objects.filter(pk__in=ids[:unknown]).update(state="unknown")

    head = attempts.head_of(host, "t")

    assert head is not None
    assert head.pk == ids[unknown]


def test_head_of_with_only_unknown_submissions_is_none(
    host: Host, clock: FakeClock, echo: Any
) -> None:
    receipts = [
        durable_agent.submit(host=host, thread="t", agent="echo", payload=i) for i in range(33)
    ]
    Submission.objects.filter(pk__in=[r.submission_id for r in receipts]).update(state="unknown")

    assert attempts.head_of(host, "t") is None


def test_the_selection_commits_nothing_and_the_checkpoint_stores_the_cursor(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    # Note [The round-robin cursor is written by the checkpoint]
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    stored: list[str | None] = []

    def look(name: str) -> None:
        if name == "maintenance:select:after":
            stored.append(MaintenanceState.objects.get(host=host).last_served_thread)

    with failpoints.installed(look):
        run_pass(host)

    assert stored == [None]
    assert calls == [("echo", 1)]
    assert MaintenanceState.objects.get(host=host).last_served_thread == "t"


def test_a_pass_with_no_binding_waits_deletes_none(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    run_pass(host)  # the host's first pass stores the registry key (and drops every wait)
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)

    with CaptureQueriesContext(connection) as queries:
        run_pass(host)

    assert calls == [("echo", 1)]
    # the lanes' statement asks whether any wait exists (on PostgreSQL inside the call of
    # Note [Lock and read in one call]); nothing deletes one
    deletes = [
        q["sql"]
        for q in queries.captured_queries
        if "bindingretry" in q["sql"].lower() or rows.FUNCTION in q["sql"]
    ]
    assert deletes
    assert not any(sql.startswith("DELETE") for sql in deletes), deletes


def _reads_of(queries: CaptureQueriesContext, table: str) -> list[str]:
    """The reads of ``table``'s rows (not the lanes' statement, which only asks whether any
    exists: Note [Begin knows the native step's records])."""
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith(f'SELECT "{table}".')]


def _generation_reads(queries: CaptureQueriesContext) -> list[str]:
    """The statements that read the host's generation alone (no scan joined to it)."""
    return [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith('SELECT "durable_agent_maintenancestate"."dirty"')
        and "JOIN" not in q["sql"]
    ]


def test_the_checkpoint_reads_its_generation_with_its_scan(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    # Note [The checkpoint's scan reads its generation]: no read of the generation alone.
    run_pass(host)
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)

    with CaptureQueriesContext(connection) as queries:
        report = run_pass(host)

    assert calls == [("echo", 1)]
    assert report.phase == "actionable"
    assert _generation_reads(queries) == []
    state = MaintenanceState.objects.get(host=host)
    assert state.processed == state.dirty


def test_a_runtime_without_the_joint_scan_reads_the_generation_first(
    host: Host,
    clock: FakeClock,
    echo: Any,
    calls: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The method is optional (Runtime's docstring): without it the pass reads the generation
    # before it scans, and still acknowledges what it processed.
    monkeypatch.delattr(ReferenceRuntime, "scan_nonterminal_with_generation")
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)

    with CaptureQueriesContext(connection) as queries:
        report = run_pass(host)

    assert calls == [("echo", 1)]
    assert report.phase == "actionable"
    assert len(_generation_reads(queries)) == 1
    state = MaintenanceState.objects.get(host=host)
    assert state.processed == state.dirty


def test_a_pass_with_no_binding_waits_reads_them_at_most_once(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    # Note [What the pass already knows after its agents]: only a pass creates binding waits;
    # on PostgreSQL begin read that there are none (Note [Begin knows the native step's
    # records]).
    run_pass(host)
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)

    with CaptureQueriesContext(connection) as queries:
        run_pass(host)

    assert calls == [("echo", 1)]
    expected = 0 if connection.vendor == "postgresql" else 1
    assert len(_reads_of(queries, "durable_agent_bindingretry")) == expected
    assert len(_reads_of(queries, "durable_agent_recoveryfault")) == expected


def test_stored_faults_and_binding_waits_are_read_by_the_pass(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    # Note [Begin knows the native step's records]: with a fault on one thread and a binding
    # wait on another, the pass reads both, and runs neither thread's head.
    run_pass(host)
    receipts = {
        thread: durable_agent.submit(host=host, thread=thread, agent="echo", payload=thread)
        for thread in ("faulted", "parked")
    }
    now = clock.now()
    RecoveryFault.objects.create(
        host=host,
        thread="faulted",
        first_failed_at=now,
        last_failed_at=now,
        attempts=1,
        retry_at=now + timedelta(hours=1),
        failure={"phase": "recovery", "reason": "failure", "operation": "run_recovery"},
        recipients=[str(receipts["faulted"].submission_id)],
    )
    BindingRetry.objects.create(
        host=host,
        thread="parked",
        submission=str(receipts["parked"].submission_id),
        attempts=1,
        reported_at=now,
        registry_key=MaintenanceState.objects.get(host=host).binding_registry_key,
    )

    with CaptureQueriesContext(connection) as queries:
        run_pass(host)

    assert calls == []
    assert len(_reads_of(queries, "durable_agent_recoveryfault")) >= 1
    assert len(_reads_of(queries, "durable_agent_bindingretry")) >= 1


def test_a_binding_wait_the_pass_recorded_is_read_by_its_checkpoint(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    # The head's agent is gone: the attempt parks the thread, and the checkpoint's observation
    # reads that wait (the thread waits, so the checkpoint acknowledges the generation).
    run_pass(host)
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    registry.unregister("echo", "1")

    with CaptureQueriesContext(connection) as queries:
        run_pass(host)

    assert calls == []
    # the first observation's read, unless begin said there were none (PostgreSQL)
    expected = 1 if connection.vendor == "postgresql" else 2
    assert len(_reads_of(queries, "durable_agent_bindingretry")) == expected
    assert BindingRetry.objects.filter(host=host).count() == 1
    state = MaintenanceState.objects.get(host=host)
    assert state.processed == state.dirty


def test_the_checkpoint_finishes_a_pass_that_has_nothing_after_it(
    host: Host, clock: FakeClock, echo: Any, calls: list[Any]
) -> None:
    # Note [The checkpoint finishes a pass that has nothing after it]
    run_pass(host)
    durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    hits: list[str] = []

    with failpoints.installed(failpoints.recorder(hits)), CaptureQueriesContext(connection) as q:
        report = run_pass(host)

    assert calls == [("echo", 1)]
    assert "maintenance:checkpoint:after" in hits
    assert "maintenance:finish:before" not in hits
    assert report.alarm == "cleared"
    # The record is written in the checkpoint's transaction, before it writes the state row
    # (on PostgreSQL in the same statement: Note [One write statement per alarm transaction]).
    sql = [query["sql"] for query in q.captured_queries]
    inserted = [i for i, s in enumerate(sql) if 'INSERT INTO "durable_agent_passrecord' in s]
    acknowledged = next(i for i, s in enumerate(sql) if 'SET "processed"' in s)
    assert len(inserted) == 1
    if connection.vendor == "postgresql":
        assert inserted[0] == acknowledged
    else:
        assert inserted[0] < acknowledged
    record = PassRecord.objects.filter(host=host).latest("id")
    assert (record.phase, record.settled, record.alarm) == ("actionable", 1, "cleared")
    state = MaintenanceState.objects.get(host=host)
    assert (state.pass_lease_owner, state.pass_lease_expires_at) == (None, None)
    assert state.processed == state.dirty
    assert alarm.scheduled(host) is None


def test_a_lane_the_agent_made_due_runs_in_the_same_pass_from_what_the_checkpoint_read(
    host: Host, clock: FakeClock, calls: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Note [What the pass already knows after its agents]: the refill delivers the lane the
    # agent scheduled from the lanes the checkpoint's transaction read (it reads none itself),
    # and the checkpoint leaves the finish to the finish step, since a lane is due.
    lanes.register("outbox", lambda ctx: calls.append(("outbox", ctx.lane)))

    @registry.agent("producer", version="1")
    def producer(ctx: Any, payload: Any) -> Any:
        gate.schedule(ctx.submission.host_id, "outbox", clock.now())
        calls.append(("producer", payload))
        return payload

    run_pass(host)
    durable_agent.submit(host=host, thread="t", agent="producer", payload=1)
    active_lanes = waves.gate.active_lanes
    asked: list[Any] = []

    def spied(host_ref: Any) -> Any:
        asked.append(host_ref)
        return active_lanes(host_ref)

    monkeypatch.setattr(waves.gate, "active_lanes", spied)
    hits: list[str] = []

    with failpoints.installed(failpoints.recorder(hits)):
        run_pass(host)

    assert calls == [("producer", 1), ("outbox", "outbox")]
    assert asked == []
    assert "maintenance:finish:before" in hits
    assert alarm.scheduled(host) is None
