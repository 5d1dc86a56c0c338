"""The alarm transaction's statements built once (Note [Reads written once]): they read and
write exactly what the ORM does."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import Schedule

from durable_agent.agents import transitions
from durable_agent.maintenance import gate
from durable_agent.maintenance.lane_ids import LIFECYCLE, NATIVE
from durable_agent.maintenance.store.rows import (
    Stored,
    _reads,
    insert_row,
    load_lanes,
    load_lanes_and_tickets,
    lock_state_row,
    run_update,
    update_statement,
    update_where,
    writes_together,
)
from durable_agent.maintenance.store.transactions import (
    AlarmTx,
    producing_lanes,
    run_alarm_transaction,
)
from durable_agent.maintenance.types import Lane
from durable_agent.models import (
    BindingRetry,
    DueLane,
    Host,
    MaintenanceState,
    MutationTicket,
    PassRecord,
    RecoveryFault,
    Submission,
    SubmissionOutcome,
    SubmissionState,
)
from durable_agent.testing import FakeClock
from tests.factories import SubmissionFactory, ThreadFactory
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db


def _fields(obj: object) -> dict[str, object]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}  # type: ignore[attr-defined]


def test_lock_state_row__reads_what_the_orm_reads(clock: FakeClock) -> None:
    host = Host.objects.create(key="state")
    caught_up(host)
    MaintenanceState.objects.filter(host=host).update(
        retry_generation=3,
        retry_not_before=clock.now() + timedelta(seconds=2),
        retry_native_only=True,
        retry_stalls=2,
        last_served_thread="t1",
    )
    state = lock_state_row(host.pk)
    assert state is not None
    assert _fields(state) == _fields(MaintenanceState.objects.get(host=host))
    assert state.retry_native_only is True  # a boolean, not SQLite's 1
    assert state.retry_not_before == clock.now() + timedelta(seconds=2)  # an aware datetime


def test_lock_state_row__none_for_a_host_without_state() -> None:
    host = Host.objects.create(key="no-state")
    assert lock_state_row(host.pk) is None


def test_load_lanes__lanes_in_order_with_the_host_and_its_slot(clock: FakeClock) -> None:
    host = Host.objects.create(key="lanes")
    caught_up(host)
    gate.schedule(host, LIFECYCLE, clock.now() + timedelta(seconds=5))
    lanes, loaded = load_lanes(host.pk)
    expected = [Lane.from_model(row) for row in DueLane.objects.filter(host=host).order_by("lane")]
    assert lanes == expected
    assert [lane.lane for lane in lanes] == sorted(lane.lane for lane in lanes)
    assert {NATIVE, LIFECYCLE} <= {lane.lane for lane in lanes}
    assert loaded is not None
    assert _fields(loaded) == _fields(Host.objects.get(pk=host.pk))
    with CaptureQueriesContext(connection) as captured:
        slot = loaded.alarm  # read by the same statement: no query
    assert len(captured) == 0
    assert slot is not None
    assert model_to_dict(slot) == model_to_dict(Schedule.objects.get(durable_agent_host=host))


def test_load_lanes__a_host_without_a_slot_has_none_cached() -> None:
    host = Host.objects.create(key="no-slot")
    DueLane.objects.create(host=host, lane=NATIVE)
    lanes, loaded = load_lanes(host.pk)
    assert [lane.lane for lane in lanes] == [NATIVE]
    assert loaded is not None
    with CaptureQueriesContext(connection) as captured:
        assert loaded.alarm is None
    assert len(captured) == 0


def test_load_lanes__nothing_for_a_host_without_lanes() -> None:
    host = Host.objects.create(key="bare")
    assert load_lanes(host.pk) == ([], None)


def test_update_where__prepares_values_and_reports_rows_written(clock: FakeClock) -> None:
    host = Host.objects.create(key="cas")
    row = DueLane.objects.create(host=host, lane=NATIVE, revision=4)
    due = clock.now() + timedelta(seconds=1)
    fields = {"revision": 5, "due_at": due, "reported": True}
    stale = {"host": host.pk, "lane": NATIVE, "revision": 3}
    written: list[int] = []
    update_where(DueLane, fields, stale, then=written.append)  # a compare-and-set that lost
    update_where(DueLane, fields, {**stale, "revision": 4}, then=written.append)
    assert written == [0, 1]
    row.refresh_from_db()
    assert (row.revision, row.due_at, row.reported) == (5, due, True)


def test_run_update__null_conditions_at_once_even_inside_writes_together(
    clock: FakeClock,
) -> None:
    # The settle's statement (Note [A completed attempt settles in one statement]): IS NULL
    # among the conditions, its count known at once, a JSON None stored as SQL NULL.
    thread = ThreadFactory()
    rows = [
        SubmissionFactory(
            thread=thread,
            state=SubmissionState.RUNNING,
            lease_owner="me",
            lease_expires_at=clock.now() + timedelta(minutes=1),
            abort_requested_at=aborted,
            result={"old": n},
        )
        for n, aborted in ((1, None), (2, clock.now()))
    ]
    fields = transitions.settled(SubmissionOutcome.COMPLETED, clock.now(), result=None)
    with writes_together(connection.alias):
        counts = [
            run_update(
                update_statement(
                    Submission,
                    fields,
                    {"id": row.pk, "lease_owner": "me"},
                    null=("abort_requested_at",),
                )
            )
            for row in rows
        ]
        assert counts == [1, 0]  # known before the block's end
    other = update_statement(Submission, fields, {"id": rows[0].pk, "lease_owner": "other"})
    assert run_update(other) == 0
    for row in rows:
        row.refresh_from_db()
    assert [(r.state, r.result) for r in rows] == [
        (SubmissionState.SETTLED, None),
        (SubmissionState.RUNNING, {"old": 2}),
    ]
    assert Submission.objects.filter(pk=rows[0].pk, result__isnull=True).exists()  # SQL NULL


def test_writes_together__one_statement_on_postgresql_each_check_on_its_own_count(
    clock: FakeClock,
) -> None:
    """Note [One write statement per alarm transaction]."""
    host = Host.objects.create(key="together")
    lanes = [DueLane.objects.create(host=host, lane=name, revision=4) for name in ("a", "b")]
    due = clock.now() + timedelta(seconds=1)
    written: list[tuple[str, int]] = []
    with CaptureQueriesContext(connection) as queries:
        with writes_together(connection.alias):
            for lane, revision in (("a", 4), ("b", 3)):  # b's compare-and-set loses
                update_where(
                    DueLane,
                    {"revision": 5, "due_at": due},
                    {"host": host.pk, "lane": lane, "revision": revision},
                    then=lambda n, lane=lane: written.append((lane, n)),
                )
            assert written == [] or connection.vendor != "postgresql"
    assert written == [("a", 1), ("b", 0)]
    assert len(queries) == 1 if connection.vendor == "postgresql" else 2
    for row in lanes:
        row.refresh_from_db()
    assert [(r.lane, r.revision, r.due_at) for r in lanes] == [("a", 5, due), ("b", 4, None)]


def test_writes_together__a_block_that_raises_writes_nothing() -> None:
    host = Host.objects.create(key="raises")
    DueLane.objects.create(host=host, lane="a", revision=4)
    with pytest.raises(RuntimeError), writes_together(connection.alias):
        update_where(DueLane, {"revision": 5}, {"host": host.pk, "lane": "a"})
        if connection.vendor != "postgresql":
            raise RuntimeError("the write ran at once here")
        raise RuntimeError("before the block's end")
    revision = DueLane.objects.get(host=host, lane="a").revision
    assert revision == (4 if connection.vendor == "postgresql" else 5)


def test_statements__lock_where_the_database_has_row_locks() -> None:
    reads = _reads(connection)
    if connection.features.has_select_for_update:
        assert reads.lock_state_sql.endswith(" FOR UPDATE")
        assert reads.load_sql.endswith(' FOR UPDATE OF "durable_agent_duelane"')
    else:
        assert "FOR UPDATE" not in reads.lock_state_sql + reads.load_sql
    assert reads.load_sql.count("ORDER BY") == 1


def test_load_lanes_and_tickets__the_tickets_come_with_the_lanes_on_postgresql(
    clock: FakeClock,
) -> None:
    """Note [The tickets come with the lanes]: the same answer as the tickets' own query."""
    host = Host.objects.create(key="tickets")
    gate.schedule(host, LIFECYCLE, clock.now())
    now = clock.now()
    for lanes, ttl in ((["agent:native", "outbox"], 30), (["mail"], 1), (["later"], 5)):
        MutationTicket.objects.create(  # "mail" expired 1 s ago
            host=host,
            lanes=lanes,
            created_at=now - timedelta(seconds=2),
            expires_at=now + timedelta(seconds=ttl - 2 if lanes == ["mail"] else ttl),
        )
    tickets = load_lanes_and_tickets(host.pk).tickets
    if connection.vendor != "postgresql":
        assert tickets is None
        return
    assert sorted(tickets) == sorted(
        (ticket.lanes, ticket.expires_at) for ticket in MutationTicket.objects.filter(host=host)
    )

    def asked(tx: AlarmTx) -> list[tuple[int, frozenset[str]]]:
        assert tx.queue.tickets is not None
        return [tx.producing_lanes(now + timedelta(seconds=s)) for s in (0, 10, 60)]

    assert run_alarm_transaction(host, "test tickets", asked) == [
        producing_lanes(host.pk, now + timedelta(seconds=s)) for s in (0, 10, 60)
    ]
    assert producing_lanes(host.pk, now)[1] == {"agent:native", "outbox", "later"}


def test_load_lanes_and_tickets__no_ticket_is_an_empty_list_on_postgresql() -> None:
    host = Host.objects.create(key="no-tickets")
    gate.schedule(host, LIFECYCLE, timezone.now())
    tickets = load_lanes_and_tickets(host.pk).tickets
    assert tickets == ([] if connection.vendor == "postgresql" else None)


def test_load_lanes_and_tickets__says_whether_faults_and_binding_waits_exist_on_postgresql(
    clock: FakeClock,
) -> None:
    """Note [Begin knows the native step's records]: each ``EXISTS`` column answers for the
    host alone."""
    host, other = (Host.objects.create(key=key) for key in ("stored", "other"))
    for each in (host, other):
        gate.schedule(each, LIFECYCLE, clock.now())
    now = clock.now()
    seen = [load_lanes_and_tickets(host.pk).stored]
    RecoveryFault.objects.create(
        host=other, thread="t", first_failed_at=now, last_failed_at=now, retry_at=now
    )
    BindingRetry.objects.create(
        host=other, thread="t", submission="1", reported_at=now, registry_key="k"
    )
    seen.append(load_lanes_and_tickets(host.pk).stored)
    RecoveryFault.objects.create(
        host=host, thread="t", first_failed_at=now, last_failed_at=now, retry_at=now
    )
    seen.append(load_lanes_and_tickets(host.pk).stored)
    BindingRetry.objects.create(
        host=host, thread="u", submission="2", reported_at=now, registry_key="k"
    )
    seen.append(load_lanes_and_tickets(host.pk).stored)
    RecoveryFault.objects.filter(host=host).delete()
    seen.append(load_lanes_and_tickets(host.pk).stored)
    if connection.vendor != "postgresql":
        assert seen == [None] * 5
        return
    assert seen == [
        Stored(faults=False, binding_waits=False),
        Stored(faults=False, binding_waits=False),
        Stored(faults=True, binding_waits=False),
        Stored(faults=True, binding_waits=True),
        Stored(faults=False, binding_waits=True),
    ]


def test_insert_row__with_the_other_writes_on_postgresql_and_then_gets_its_id(
    clock: FakeClock,
) -> None:
    host = Host.objects.create(key="insert")
    DueLane.objects.create(host=host, lane="a", revision=4)
    ids: list[int] = []
    values = {"host_id": host.pk, "started_at": clock.now(), "phase": "caught-up"}
    with CaptureQueriesContext(connection) as queries:
        with writes_together(connection.alias):
            update_where(DueLane, {"revision": 5}, {"host": host.pk, "lane": "a"})
            insert_row(PassRecord, values, then=ids.append)
    assert len(queries) == (1 if connection.vendor == "postgresql" else 2)
    (record,) = PassRecord.objects.filter(host=host)
    assert ids == [record.pk]
    assert (record.phase, record.started_at, record.finished_at) == ("caught-up", clock.now(), None)
    assert DueLane.objects.get(host=host, lane="a").revision == 5


def test_writes_together__a_block_inside_another_writes_at_its_own_end() -> None:
    host = Host.objects.create(key="nested")
    DueLane.objects.create(host=host, lane="a", revision=4)
    DueLane.objects.create(host=host, lane="b", revision=4)
    seen: list[int] = []
    with writes_together(connection.alias):
        update_where(DueLane, {"revision": 5}, {"host": host.pk, "lane": "a"})
        with writes_together(connection.alias):
            update_where(DueLane, {"revision": 6}, {"host": host.pk, "lane": "b"})
        seen = list(
            DueLane.objects.filter(host=host).order_by("lane").values_list("revision", flat=True)
        )
    assert seen == ([4, 6] if connection.vendor == "postgresql" else [5, 6])
    assert list(
        DueLane.objects.filter(host=host).order_by("lane").values_list("revision", flat=True)
    ) == [5, 6]
