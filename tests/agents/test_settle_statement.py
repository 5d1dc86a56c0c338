"""A completed attempt's settlement and its native progress in one statement on PostgreSQL,
outside any transaction (Note [A write and its progress in one statement] in
``durable_agent/maintenance/mutations/gate.py``); elsewhere, ``gate.transaction`` as before."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

import durable_agent
from durable_agent.agents.runtime import ReferenceRuntime
from durable_agent.errors import AlarmError
from durable_agent.maintenance import failpoints, gate, run_pass
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.maintenance.store.rows import update_statement
from durable_agent.models import DueLane, Host, MaintenanceState, Submission
from durable_agent.testing import FakeClock
from tests.agents.conftest import later

# Committed transactions: the statement under test is one only outside every transaction.
pytestmark = pytest.mark.django_db(transaction=True)

STATEMENT = 'WITH written AS (UPDATE "durable_agent_submission"'


@contextmanager
def statements() -> Iterator[list[tuple[str, bool]]]:
    """(SQL, inside a transaction block) of every statement the connection runs meanwhile."""
    seen: list[tuple[str, bool]] = []

    def note(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        seen.append((sql, connection.in_atomic_block))
        return execute(sql, *args)

    with connection.execute_wrapper(note):
        yield seen


def ledger(host: Host, pk: int) -> tuple[str, int, int]:
    """(the submission's state, the native lane's revision, the host's generation)."""
    lane = DueLane.objects.get(host=host, lane=NATIVE)
    state = MaintenanceState.objects.get(host=host)
    return Submission.objects.get(pk=pk).state, lane.revision, state.dirty


@pytest.fixture
def fresh(clock: FakeClock, echo: Any) -> tuple[Host, int]:
    """A caught-up host with one fresh submission of ``echo``."""
    host = Host.objects.create(key="settle-statement")
    run_pass(host)
    return host, durable_agent.submit(host=host, thread="t", agent="echo", payload=1).submission_id


def test_settle__a_completed_attempt_is_one_statement_outside_a_transaction(
    clock: FakeClock, reference: ReferenceRuntime, fresh: tuple[Host, int]
) -> None:
    host, pk = fresh
    with statements() as seen, gate.native_source():  # as the pass calls it
        settlement = reference.process_thread_head(host, "t", later(clock))
    assert settlement is not None
    assert settlement.outcome == "completed"
    state, revision, dirty = ledger(host, pk)
    assert (state, Submission.objects.get(pk=pk).outcome) == ("settled", "completed")
    assert dirty == MaintenanceState.objects.get(host=host).processed + 1  # the submission's
    assert Host.objects.select_related("alarm").get(pk=host.pk).alarm is not None
    sql = [s for s, _ in seen]
    if connection.vendor != "postgresql":
        assert not any(s.startswith(STATEMENT) for s in sql)
        assert revision > 0
        return
    settles = [(s, inside) for s, inside in seen if s.startswith(STATEMENT)]
    assert len(settles) == 1, "\n".join(sql)
    text, inside = settles[0]
    assert "durable_agent_commit_intent" in text
    assert inside is False  # its own transaction: no BEGIN, no COMMIT around it
    after = sql[sql.index(text) + 1 :]
    assert not any("durable_agent_commit_intent" in s for s in after)
    assert not any(s.startswith('UPDATE "durable_agent_submission"') for s in after)


def test_settle__a_failure_before_the_statement_writes_nothing(
    clock: FakeClock, reference: ReferenceRuntime, fresh: tuple[Host, int]
) -> None:
    # The failpoint a crash matrix case passes before the settlement commits: nothing of it
    # lands, the submission stays running under its lease for recovery.
    host, pk = fresh
    revision = DueLane.objects.get(host=host, lane=NATIVE).revision
    with (
        failpoints.installed(failpoints.raise_at("maintenance:queue:flush")),
        pytest.raises(AlarmError, match="failpoint maintenance:queue:flush"),
        gate.native_source(),
    ):
        reference.process_thread_head(host, "t", later(clock))
    state, after, _ = ledger(host, pk)
    assert state == "running"
    assert Submission.objects.get(pk=pk).outcome is None
    assert after == revision  # the settlement's native progress did not land either


def test_update_with_progress__no_row_written_runs_no_progress(
    clock: FakeClock, fresh: tuple[Host, int]
) -> None:
    host, pk = fresh
    before = ledger(host, pk)
    alarm = Host.objects.select_related("alarm").get(pk=host.pk).alarm
    update = update_statement(
        Submission, {"state": "completed"}, {"id": pk, "lease_owner": "nobody"}
    )
    written = gate.update_with_progress(host, update, [NATIVE])
    assert written is (False if connection.vendor == "postgresql" else None)
    assert ledger(host, pk) == before
    assert Host.objects.select_related("alarm").get(pk=host.pk).alarm == alarm


def test_update_with_progress__inside_a_transaction_leaves_it_to_the_caller(
    clock: FakeClock, fresh: tuple[Host, int]
) -> None:
    host, pk = fresh
    before = ledger(host, pk)
    update = update_statement(Submission, {"state": "completed"}, {"id": pk})
    with transaction.atomic():
        assert gate.update_with_progress(host, update, [NATIVE]) is None
    with gate.transaction(host):
        assert gate.update_with_progress(host, update, [NATIVE]) is None
    assert ledger(host, pk) == before


def test_update_with_progress__a_written_row_commits_with_its_progress(
    clock: FakeClock, fresh: tuple[Host, int]
) -> None:
    host, pk = fresh
    dirty = ledger(host, pk)[2]
    update = update_statement(Submission, {"payload": "edited"}, {"id": pk})
    written = gate.update_with_progress(host, update, ["outbox"])
    if connection.vendor != "postgresql":
        assert written is None
        return
    assert written is True
    assert Submission.objects.get(pk=pk).payload == "edited"
    lane = DueLane.objects.get(host=host, lane="outbox")
    assert (lane.revision, lane.due_at) == (1, clock.now())
    # Outside maintenance it is a producer's progress on a lane other than native: the
    # generation does not move, the slot is armed.
    assert ledger(host, pk)[2] == dirty
    assert Host.objects.select_related("alarm").get(pk=host.pk).alarm is not None


def test_update_with_progress__a_write_routed_elsewhere_is_left_to_the_caller(
    clock: FakeClock, fresh: tuple[Host, int]
) -> None:
    # One statement runs on one database: a write whose router picked another one than the
    # host's state takes gate.transaction.
    host, pk = fresh
    before = ledger(host, pk)
    built = update_statement(Submission, {"payload": "edited"}, {"id": pk})
    elsewhere = built._replace(using="reporting")
    assert gate.update_with_progress(host, elsewhere, [NATIVE]) is None
    assert ledger(host, pk) == before
    assert Submission.objects.get(pk=pk).payload == 1
