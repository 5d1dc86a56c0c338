"""The pass as one object: what its begin read under the host's locks is not read again."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from durable_agent import lanes
from durable_agent.maintenance import gate, run_pass, transactions
from durable_agent.maintenance.store import rows
from durable_agent.models import Host, MaintenanceState
from durable_agent.testing import FakeClock, ScriptedRuntime

pytestmark = pytest.mark.django_db
TABLE = MaintenanceState._meta.db_table


def test_pass__reads_the_state_row_only_in_its_transactions(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An actionable pass with a wave after the native step: the state row is read whole only
    # by its alarm transactions' locks; outside them only the generation the native step's
    # scan answers for.
    locks: list[int] = []
    lock_state_row = transactions.lock_state_row

    def counted(host_id: int) -> MaintenanceState | None:
        locks.append(host_id)
        return lock_state_row(host_id)

    monkeypatch.setattr(transactions, "lock_state_row", counted)
    lock_and_read = transactions.lock_and_read  # Note [Lock and read in one call]

    def read_counted(host_id: int) -> object:
        found = lock_and_read(host_id)
        if found is not None:
            locks.append(host_id)
        return found

    monkeypatch.setattr(transactions, "lock_and_read", read_counted)
    ran: list[str] = []
    lanes.register("after", lambda ctx: ran.append(ctx.lane), phase="after-native")
    runtime.submit(host, "t1")
    gate.schedule(host, "after", clock.now())
    locks.clear()
    with CaptureQueriesContext(connection) as queries:
        report = run_pass(host)
    assert (report.phase, report.settled, ran) == ("actionable", 1, ["after"])
    whole = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith("SELECT")
        and (
            (re.search(rf'FROM\s+"?{TABLE}"?', q["sql"]) and "last_after_native_lane" in q["sql"])
            or rows.FUNCTION in q["sql"]
        )
    ]
    assert locks, "the pass locks its state row"
    assert len(whole) == len(locks), "\n".join(whole)
