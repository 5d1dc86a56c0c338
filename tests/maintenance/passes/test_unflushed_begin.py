"""Begin and the pass's last transaction (the finish, or the checkpoint that ends the pass)
commit without waiting for the WAL flush, and nothing else in the pass does: the handler, a
wave's completion, the agent's claim and its settlement wait for the disk (Note [Begin does
not wait for the flush] in ``durable_agent/maintenance/passes/run.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import durable_agent
from durable_agent import lanes
from durable_agent.agents import registry
from durable_agent.maintenance import gate, run_pass
from durable_agent.maintenance.store.transactions import AlarmTx, run_alarm_transaction
from durable_agent.models import Host, MaintenanceState, PassRecord
from durable_agent.testing import FakeClock

# Committed transactions: the setting's scope is the transaction, which a test case's own
# transaction would stretch over the whole test.
pytestmark = pytest.mark.django_db(transaction=True)

UNFLUSHED = "set_config('synchronous_commit', 'off', true)"


def _synchronous_commit() -> str | None:
    """The connection's ``synchronous_commit`` now (None on a database without it)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('synchronous_commit')")
        value: str = cursor.fetchone()[0]
    return value


@pytest.fixture
def agent_saw() -> Iterator[list[str | None]]:
    """The agent ``unflushed-echo`` v1, registered for the test: what ``synchronous_commit``
    each of its runs saw."""
    saved = registry.snapshot()
    seen: list[str | None] = []

    @registry.agent("unflushed-echo", version="1")
    def echo(ctx: object, payload: object) -> object:
        seen.append(_synchronous_commit())
        return payload

    yield seen
    registry.restore(saved)


def test_begin__commits_unflushed_and_the_handler_and_the_completion_flushed(
    clock: FakeClock,
) -> None:
    host = Host.objects.create(key="unflushed")
    seen: list[str | None] = []
    lanes.register("outbox", lambda ctx: seen.append(_synchronous_commit()))
    run_pass(host)  # the first pass stores the registry key
    gate.schedule(host, "outbox", clock.now())
    with CaptureQueriesContext(connection) as queries:
        report = run_pass(host)
    assert report.phase == "caught-up"
    sql = [q["sql"] for q in queries.captured_queries]
    unflushed = [q for q in sql if UNFLUSHED in q]
    if connection.vendor == "postgresql":
        # One statement, begin's writes: the lease, the lane's claim, the slot. The
        # completion (the only record that the handler ran) waits for its flush.
        assert len(unflushed) == 1, "\n".join(sql)
        assert '"pass_lease_owner"' in unflushed[0]
        assert 'UPDATE "durable_agent_duelane"' in unflushed[0]
        assert any('INSERT INTO "durable_agent_passrecord"' in q for q in sql)
        assert seen == ["on"]
        assert _synchronous_commit() == "on"
    else:
        assert (unflushed, seen) == ([], [None])


def test_fresh_submission__the_claim_and_the_settlement_flushed_the_checkpoint_not(
    clock: FakeClock, agent_saw: list[str | None]
) -> None:
    seen = agent_saw
    host = Host.objects.create(key="fresh")
    run_pass(host)
    durable_agent.submit(host=host, thread="t", agent="unflushed-echo", payload=1)
    with CaptureQueriesContext(connection) as queries:
        report = run_pass(host)
    assert (report.phase, report.settled) == ("actionable", 1)
    sql = [q["sql"] for q in queries.captured_queries]
    unflushed = [q for q in sql if UNFLUSHED in q]
    if connection.vendor != "postgresql":
        assert (unflushed, seen) == ([], [None])
        return
    # Begin's writes, then the checkpoint that finishes the pass (its record), the last
    # statement; the head's claim and the settlement between them commit flushed.
    assert len(unflushed) == 2, "\n".join(sql)
    assert '"pass_lease_owner"' in unflushed[0]
    assert 'INSERT INTO "durable_agent_passrecord"' in unflushed[1]
    # Only the history's trim may follow, in the same transaction (a pass in about twenty
    # trims, by its record's id: Note [One trim in twenty, in any order] in finish.py).
    after = sql[sql.index(unflushed[1]) + 1 :]
    assert [q for q in after if '"durable_agent_passrecord"' not in q] == ["COMMIT"], after
    between = sql[sql.index(unflushed[0]) + 1 : sql.index(unflushed[1])]
    assert any('UPDATE "durable_agent_submission"' in q for q in between), "\n".join(sql)
    assert any("durable_agent_commit_intent" in q for q in between), "\n".join(sql)
    assert seen == ["on"]
    assert _synchronous_commit() == "on"


def test_finish__a_pass_with_a_wave_beside_the_agent_finishes_unflushed(
    clock: FakeClock, agent_saw: list[str | None]
) -> None:
    seen: list[str | None] = []
    lanes.register("outbox", lambda ctx: seen.append(_synchronous_commit()))
    host = Host.objects.create(key="finish")
    run_pass(host)
    gate.schedule(host, "outbox", clock.now())
    durable_agent.submit(host=host, thread="t", agent="unflushed-echo", payload=1)
    with CaptureQueriesContext(connection) as queries:
        report = run_pass(host)
    assert (report.phase, report.settled, seen) == (
        "actionable",
        1,
        ["on" if connection.vendor == "postgresql" else None],
    )
    sql = [q["sql"] for q in queries.captured_queries]
    unflushed = [q for q in sql if UNFLUSHED in q]
    if connection.vendor != "postgresql":
        assert unflushed == []
        return
    # Begin's writes and the finish's (the lease given back); the wave's completion and the
    # settlement between them wait for their flush.
    assert len(unflushed) == 2, "\n".join(sql)
    assert '"pass_lease_owner"' in unflushed[0]
    assert '"pass_lease_owner"' in unflushed[1]
    between = sql[sql.index(unflushed[0]) + 1 : sql.index(unflushed[1])]
    assert any("durable_agent_commit_intent" in q for q in between), "\n".join(sql)
    assert any('UPDATE "durable_agent_duelane"' in q for q in between), "\n".join(sql)


def test_failed_handler__only_begin_commits_unflushed(clock: FakeClock) -> None:
    host = Host.objects.create(key="failing")

    def fail(ctx: object) -> None:
        raise RuntimeError("handler failed")

    lanes.register("outbox", fail)
    run_pass(host)
    gate.schedule(host, "outbox", clock.now())
    with CaptureQueriesContext(connection) as queries, pytest.raises(RuntimeError):
        run_pass(host)
    assert PassRecord.objects.filter(host=host).latest("id").phase == "failed"
    unflushed = [q["sql"] for q in queries.captured_queries if UNFLUSHED in q["sql"]]
    assert len(unflushed) == (1 if connection.vendor == "postgresql" else 0)
    assert all('"pass_lease_owner"' in q for q in unflushed)
    # The failure's back-off re-armed the slot, flushed.
    assert Host.objects.select_related("alarm").get(pk=host.pk).alarm is not None


def test_begin__a_pass_that_finds_nothing_due_sends_no_setting(clock: FakeClock) -> None:
    host = Host.objects.create(key="prompt")
    run_pass(host)
    with CaptureQueriesContext(connection) as queries:
        report = run_pass(host, prompt=True)
    assert report.phase == "stale"
    assert not [q for q in queries.captured_queries if UNFLUSHED in q["sql"]]


def _unflushed_write(tx: AlarmTx) -> None:
    tx.state.dirty += 1
    tx.commit_unflushed()


def test_run_alarm_transaction__unflushed_only_as_the_outermost_transaction(
    clock: FakeClock,
) -> None:
    host = Host.objects.create(key="nested")
    run_alarm_transaction(host, "create the state", lambda tx: None)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as nested:
            run_alarm_transaction(host, "inside the caller's transaction", _unflushed_write)
        # The caller's transaction keeps its own setting: it commits flushed.
        assert _synchronous_commit() in ("on", None)
    assert not [q for q in nested.captured_queries if UNFLUSHED in q["sql"]]
    with CaptureQueriesContext(connection) as outermost:
        run_alarm_transaction(host, "on its own", _unflushed_write)
    sent = [q for q in outermost.captured_queries if UNFLUSHED in q["sql"]]
    assert len(sent) == (1 if connection.vendor == "postgresql" else 0)
    assert _synchronous_commit() in ("on", None)  # the setting ended with its transaction
    assert MaintenanceState.objects.get(host=host).dirty == 3  # 1, then one per write
