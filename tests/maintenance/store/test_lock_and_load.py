"""The alarm transaction's lock and lanes' read in one round trip on PostgreSQL (Note [The lock
and the lanes in one round trip] in ``durable_agent/maintenance/store/rows.py``), still read in
the order Note [Read the slot after the lock] asks."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction
from psycopg import pq

from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.maintenance.store.rows import lock_and_load, slot_deadline
from durable_agent.maintenance.store.transactions import run_alarm_transaction
from durable_agent.models import Host
from durable_agent.testing import FakeClock
from tests.maintenance.helpers import caught_up

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _round_trips(fn: Callable[[], Any]) -> list[str]:
    """What the server answered while ``fn`` ran, one line per ``ReadyForQuery`` (each ends a
    round trip), read from libpq's protocol trace of this connection."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            fn()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().splitlines()
    return [line for line in lines if line.startswith("B") and "ReadyForQuery" in line]


def test_alarm_transaction__begin_the_lock_and_the_lanes_go_in_one_round_trip() -> None:
    host = Host.objects.create(key="one-trip")
    caught_up(host)

    trips = _round_trips(lambda: run_alarm_transaction(host, "nothing", lambda tx: None))

    # BEGIN, the state row's lock and the lanes' read in one; COMMIT in the other (the
    # callback changed nothing, so nothing is written). Sent one by one, they took four.
    assert len(trips) == 2, trips


def test_lock_and_load__a_missing_state_row_reads_no_lanes() -> None:
    host = Host.objects.create(key="first-use")
    with transaction.atomic():
        assert lock_and_load(host.pk) == (None, None)
    run_alarm_transaction(host, "first use", lambda tx: None)  # creates the row, in order
    with transaction.atomic():
        state, read = lock_and_load(host.pk)
    assert state is not None
    assert read is not None
    assert [lane.lane for lane in read.lanes] == [NATIVE]


def test_lock_and_load__the_slot_is_read_after_the_lock_is_granted(clock: FakeClock) -> None:
    # Another alarm transaction holds the host's locks and arms its slot; an alarm transaction
    # that waits for the lock must read the slot as that one committed it. The slot row is
    # joined to the lanes' read, not locked by it: read with a snapshot taken before the wait
    # (in one statement with the lock, or sent ahead of it), it would still be disarmed.
    host = Host.objects.create(key="waits")
    caught_up(host)
    armed_at = clock.now() + timedelta(hours=3)
    locked, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        try:
            with transaction.atomic():
                run_alarm_transaction(host, "arm", lambda tx: tx.checkpoint.at(armed_at))
                locked.set()
                assert release.wait(30)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            locked.set()
        finally:
            connections.close_all()

    seen: list[Any] = []

    def reader() -> None:
        try:
            run_alarm_transaction(
                host, "read after the lock", lambda tx: seen.append(slot_deadline(tx.host.alarm))
            )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    assert slot_deadline(Host.objects.select_related("alarm").get(pk=host.pk).alarm) is None
    first = threading.Thread(target=holder)
    first.start()
    assert locked.wait(30)
    second = threading.Thread(target=reader)
    second.start()
    try:
        _wait_for_a_lock_wait()
    finally:
        release.set()
        first.join(30)
        second.join(30)
    assert not errors, errors
    assert seen == [armed_at]


def _wait_for_a_lock_wait() -> None:
    """Until some backend of this database waits for a row lock (the reader, behind the
    holder)."""
    deadline = time.monotonic() + 20
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError("the reader never waited for the holder's lock")
