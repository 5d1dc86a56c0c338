"""Note [Lock and read in one call] (``durable_agent/maintenance/store/rows.py``): on
PostgreSQL an alarm transaction locks and reads in one call of a server-side function, which
answers exactly what the two statements do."""

from __future__ import annotations

import importlib
import logging
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from durable_agent.maintenance import gate
from durable_agent.maintenance.lane_ids import LIFECYCLE
from durable_agent.maintenance.store import rows as lock_read
from durable_agent.maintenance.store.rows import load_lanes_and_tickets, lock_state_row
from durable_agent.maintenance.store.transactions import run_alarm_transaction
from durable_agent.models import DueLane, Host, MaintenanceState, MutationTicket, RecoveryFault
from durable_agent.testing import FakeClock
from tests.maintenance.helpers import caught_up

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

migration = importlib.import_module("durable_agent.migrations.0016_lock_and_read_function")


def test_the_migration_holds_the_function_the_models_give() -> None:
    # A model change (or a django-q whose Schedule differs) must ship a new migration.
    shipped = migration.SQL.read_text()
    body = shipped[shipped.index("CREATE OR REPLACE FUNCTION") :]
    assert body == lock_read.function_sql(connection)


def test_the_installed_function_returns_the_columns_the_models_give() -> None:
    with connection.cursor() as cursor:
        cursor.execute(lock_read.CALL, [-1])
        names = [column.name for column in cursor.description]
        assert cursor.fetchall() == []  # no state row: nothing, and the caller creates it
    assert tuple(names) == lock_read._shape(connection).names


def _two_statements(host_id: int) -> tuple[dict, object]:
    with transaction.atomic():
        state = lock_state_row(host_id)
        assert state is not None
        return model_to_dict(state), load_lanes_and_tickets(host_id)


def _one_call(host_id: int) -> tuple[dict, object]:
    with transaction.atomic():
        found = lock_read.lock_and_read(host_id)
        assert found is not None
        return model_to_dict(found[0]), found[1]


def test_one_call_answers_what_the_two_statements_do(clock: FakeClock) -> None:
    host = Host.objects.create(key="one-call")
    gate.schedule(host, LIFECYCLE, clock.now() + timedelta(minutes=5))
    gate.schedule(host, "outbox", clock.now() + timedelta(minutes=1))
    now = clock.now()
    MutationTicket.objects.create(
        host=host, lanes=["outbox"], created_at=now, expires_at=now + timedelta(seconds=30)
    )
    RecoveryFault.objects.create(
        host=host, thread="t", first_failed_at=now, last_failed_at=now, retry_at=now
    )
    state, read = _one_call(host.pk)
    assert (state, read) == _two_statements(host.pk)
    assert [lane.lane for lane in read.lanes] == sorted(lane.lane for lane in read.lanes)
    assert len(read.lanes) >= 2
    assert read.tickets
    assert read.stored.faults
    assert read.host.alarm is not None
    assert read.host.alarm.pk == Host.objects.get(pk=host.pk).alarm_id


def test_a_host_without_lanes_comes_back_with_its_slot(clock: FakeClock) -> None:
    host = Host.objects.create(key="no-lanes")
    caught_up(host)
    MaintenanceState.objects.filter(host=host).update(dirty=7, processed=7)
    DueLane.objects.filter(host=host).delete()
    state, read = _one_call(host.pk)
    assert state == _two_statements(host.pk)[0]
    assert state["dirty"] == 7
    assert read.lanes == []
    assert read.tickets is None
    assert read.stored is None
    assert read.host is not None
    assert read.host.pk == host.pk
    assert read.host.key == "no-lanes"


def test_an_alarm_transaction_locks_and_reads_in_one_statement(clock: FakeClock) -> None:
    host = Host.objects.create(key="counted")
    gate.schedule(host, LIFECYCLE, clock.now())
    with CaptureQueriesContext(connection) as captured:
        run_alarm_transaction(host, "read", lambda tx: tx.queue.read())
    sql = [query["sql"] for query in captured.captured_queries]
    assert sum(lock_read.FUNCTION in text for text in sql) == 1
    assert not any("FOR UPDATE" in text for text in sql), sql


@pytest.mark.parametrize("names_checked", [False, True])
def test_a_result_of_other_columns_is_not_read(
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    names_checked: bool,
) -> None:
    # The first result of a process has its names checked, every later one its column count.
    host = Host.objects.create(key="other-columns")
    gate.schedule(host, LIFECYCLE, clock.now())
    real = lock_read._shape(connection)
    key = (connection.alias, connection.vendor)
    monkeypatch.setitem(lock_read._shapes, key, lock_read._Shape(real.names[:-1], real.n_state))
    monkeypatch.setattr(lock_read, "_refused", set())
    monkeypatch.setattr(lock_read, "_checked", {key} if names_checked else set())
    with caplog.at_level(logging.ERROR, logger="durable_agent.maintenance"):
        with CaptureQueriesContext(connection) as captured:
            lanes = run_alarm_transaction(host, "read", lambda tx: tx.queue.read())
            run_alarm_transaction(host, "read", lambda tx: tx.queue.read())
    assert [lane.lane for lane in lanes] == sorted(lane.lane for lane in lanes)
    assert lanes
    sql = [query["sql"] for query in captured.captured_queries]
    assert sum(lock_read.FUNCTION in text for text in sql) == 1  # then never again
    assert sum("FOR UPDATE" in text for text in sql) == 4  # the two statements, twice
    assert sum(lock_read.FUNCTION in record.getMessage() for record in caplog.records) == 1
