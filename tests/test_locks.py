"""The lock discipline (Note [Lock one table]), checked on the SQL every test issues.

tests/conftest.py installs tests/locks.py for the whole suite and fails any test whose row
locks break the discipline. These tests check the checker, and that the capture sees the
locks of every locking path on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction

import durable_agent
from durable_agent import lanes, tasks
from durable_agent.agents import registry
from durable_agent.agents.context import AgentContext
from durable_agent.maintenance import alarm, ensure_alarm, gate, repairs, run_pass
from durable_agent.maintenance.store.rows import lock_state_row
from durable_agent.models import Host, Submission, SubmissionState
from durable_agent.testing import FakeClock
from tests import locks

STATE = "durable_agent_maintenancestate"
SUBMISSION = "durable_agent_submission"


@pytest.fixture(autouse=True)
def _own_agent_registry() -> Iterator[None]:
    saved = registry.snapshot()
    registry.restore({})
    yield
    registry.restore(saved)


@pytest.mark.parametrize(
    ("sql", "tables"),
    [
        (
            f'SELECT "{STATE}"."id" FROM "{STATE}" WHERE "{STATE}"."host_id" = %s FOR UPDATE',
            (STATE,),
        ),
        (
            f'SELECT * FROM "{SUBMISSION}" INNER JOIN "durable_agent_thread" ON ("a" = "b") '
            f'INNER JOIN "durable_agent_host" ON ("c" = "d") ORDER BY "e" LIMIT 1 FOR UPDATE',
            (SUBMISSION, "durable_agent_thread", "durable_agent_host"),
        ),
        (
            f'SELECT * FROM "{SUBMISSION}" INNER JOIN "durable_agent_thread" ON ("a" = "b") '
            f'FOR UPDATE OF "{SUBMISSION}" SKIP LOCKED',
            (SUBMISSION,),
        ),
        (
            f'SELECT * FROM "{SUBMISSION}" WHERE "id" IN (SELECT "id" FROM "durable_agent_host") '
            "FOR NO KEY UPDATE",
            (SUBMISSION,),
        ),
        (f'SELECT * FROM "{SUBMISSION}" WHERE "x" = %s', None),
    ],
)
def test_locked_tables__reads_the_tables_a_statement_locks(sql: str, tables: Any) -> None:
    assert locks.locked_tables(sql) == tables


def test_check__a_lock_over_a_join_without_of_is_a_violation() -> None:
    sql = (
        f'SELECT * FROM "{SUBMISSION}" INNER JOIN "durable_agent_host" ON ("a" = "b") '
        "LIMIT 1 FOR UPDATE"
    )
    reasons = [violation.reason for violation in locks.check(sql, [])]
    assert reasons[0] == (
        f"locks 2 tables ({SUBMISSION!r}, 'durable_agent_host'); name one with OF"
    ), reasons


def test_check__a_table_locked_after_a_later_one_is_a_violation() -> None:
    sql = f'SELECT * FROM "{SUBMISSION}" WHERE "id" = %s FOR UPDATE OF "{SUBMISSION}"'
    assert locks.check(sql, ["durable_agent_thread"]) == []
    [violation] = locks.check(sql, [STATE])
    assert violation.reason == f"locks {SUBMISSION!r} after {STATE!r} in one transaction"


def test_check__a_table_with_no_rank_is_a_violation() -> None:
    [violation] = locks.check('SELECT * FROM "durable_agent_host" FOR UPDATE', [])
    assert "no place in LOCK_ORDER" in violation.reason


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_capture__a_lock_without_of_added_back_is_caught(host: Host, clock: FakeClock) -> None:
    """The old submission lock: ``.first()`` orders by thread and host, and locks them too."""

    @registry.agent("echo", version="1")
    def echo(ctx: AgentContext, payload: Any) -> Any:
        return payload

    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    locks.take_violations()
    with transaction.atomic():
        Submission.objects.select_for_update().filter(pk=receipt.submission_id).first()
    reasons = [violation.reason for violation in locks.take_violations()]
    assert reasons[0].startswith("locks 3 tables"), reasons
    assert "locks 'durable_agent_host', which has no place in LOCK_ORDER" in reasons


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_capture__sees_every_locking_path(host: Host, clock: FakeClock) -> None:
    """Submit, the pass (claim, settle, suspend), approve, abort, resolve_unknown, the
    repairs, the sweep and ensure_alarm: each locks, and the autouse check finds them clean."""

    @registry.agent("echo", version="1")
    def echo(ctx: AgentContext, payload: Any) -> Any:
        if payload == "ask" and not ctx.approved:
            ctx.suspend_for_approval("please")
        return payload

    with locks.capture() as seen:
        first = durable_agent.submit(host=host, thread="a", agent="echo", payload="ask")
        durable_agent.submit(host=host, thread="b", agent="echo", payload=2)
        aborted = durable_agent.submit(host=host, thread="c", agent="echo", payload=3)
        durable_agent.abort(aborted.submission_id)
        clock.advance(seconds=1)
        run_pass(host)
        assert Submission.objects.get(pk=first.submission_id).state == SubmissionState.SUSPENDED
        durable_agent.approve(first.submission_id)
        unknown = durable_agent.submit(host=host, thread="d", agent="echo", payload=4)
        Submission.objects.filter(pk=unknown.submission_id).update(state=SubmissionState.UNKNOWN)
        durable_agent.resolve_unknown(unknown.submission_id, outcome="completed")
        lanes.register("outbox", lambda ctx: None)
        gate.schedule(host, "outbox", clock.now() + timedelta(seconds=5))
        alarm.rearm(host, reason="lock test")
        with pytest.raises(repairs.NotRepairable):  # pending, not parked: locked, then refused
            repairs.lane_unpark(host=host, lane="outbox", reason="lock test")
        repairs.pass_now(host=host, reason="lock test")
        ensure_alarm(host)
        tasks.sweep()
    locked = {table for tables in seen for table in tables}
    assert locked == {
        "durable_agent_thread",
        SUBMISSION,
        STATE,
        "durable_agent_duelane",
    }, seen


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_capture__hosts_of_one_frame_lock_in_id_order(host: Host, clock: FakeClock) -> None:
    """A frame carrying two hosts flushes them in id order; the other order is caught."""
    other = Host.objects.create(key="other")
    with locks.capture() as seen, gate.transaction(other) as tx:
        tx.schedule("a", clock.now() + timedelta(seconds=3))
        gate.schedule(host, "b", clock.now() + timedelta(seconds=4))
    assert seen.count((STATE,)) >= 2
    assert locks.take_violations() == []

    with transaction.atomic():
        lock_state_row(other.pk)
        lock_state_row(host.pk)
    [violation] = locks.take_violations()
    assert violation.reason == f"locks host {host.pk}'s state row after host {other.pk}'s"
