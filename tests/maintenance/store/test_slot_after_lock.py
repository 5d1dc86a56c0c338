"""Note [Read the slot after the lock] (``durable_agent/maintenance/store/transactions.py``):
an alarm transaction that waited for the host's lock reads the slot as the holder committed it."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction

from durable_agent.maintenance.store.rows import slot_deadline
from durable_agent.maintenance.store.transactions import run_alarm_transaction
from durable_agent.models import Host
from durable_agent.testing import FakeClock
from tests.maintenance.helpers import caught_up

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_alarm_transaction__reads_the_slot_after_the_lock_is_granted(clock: FakeClock) -> None:
    # Another alarm transaction holds the host's locks and arms its slot; an alarm transaction
    # that waits for the lock must read the slot as that one committed it. The slot row is
    # joined to the lanes' read, not locked by it: read with a snapshot taken before the wait
    # (joined into the locking statement, or sent ahead of it), it would still be disarmed.
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
