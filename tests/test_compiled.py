"""Reads compiled once (Note [Reads compiled once] in durable_agent/compiled.py): the same rows
as the ORM, the statement compiled once per database, the key checked."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models.sql.compiler import SQLCompiler

from durable_agent import compiled
from durable_agent.agents import runtime as reference_runtime
from durable_agent.agents.runtime import ReferenceRuntime
from durable_agent.compiled import CompiledRead
from durable_agent.models import DueLane, MaintenanceState, Submission, SubmissionState
from tests.factories import T0, HostFactory, SubmissionFactory, ThreadFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def compilations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL of every query the ORM compiles from here on."""
    seen: list[str] = []
    original = SQLCompiler.as_sql

    def counted(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
        sql, params = original(self, *args, **kwargs)
        seen.append(sql)
        return sql, params

    monkeypatch.setattr(SQLCompiler, "as_sql", counted)
    return seen


def _ledger() -> list[int]:
    """Two hosts with submissions of every kind of column (datetimes, JSON, NULLs)."""
    hosts = []
    for n in range(2):
        thread = ThreadFactory(key=f"t{n}")
        SubmissionFactory(thread=thread, payload={"n": n, "nested": [1, "x"]})
        SubmissionFactory(
            thread=thread,
            not_before=T0 + timedelta(minutes=n + 1),
            abort_requested_at=T0,
            state=SubmissionState.SUSPENDED,
            approval_reason="?",
        )
        SubmissionFactory(thread=ThreadFactory(host=thread.host, key="a"), payload=None)
        MaintenanceState.objects.create(host=thread.host, dirty=3 + n, processed=1)
        hosts.append(int(thread.host.pk))
    return hosts


def _payloads(key: int) -> Any:
    return (
        Submission.objects.filter(host_id=key)
        .order_by("pk")
        .values_list("pk", "payload", "created_at", "not_before", "state")
    )


@pytest.mark.parametrize(
    "build",
    [reference_runtime._scan, reference_runtime._scan_with_generation, _payloads],
    ids=["scan", "scan with generation", "payloads"],
)
def test_a_compiled_read_gives_the_orms_rows(build: Any) -> None:
    read = CompiledRead(build(0).model, build)
    hosts = [*_ledger(), int(HostFactory().pk)]
    for host in hosts:
        assert read.rows(host) == list(build(host))
    assert all(read.rows(host) for host in hosts[:2])  # the comparison saw rows


def test_a_compiled_read_compiles_once_per_database(compilations: list[str]) -> None:
    first, second = _ledger()
    read = CompiledRead(Submission, _payloads)
    assert read.rows(first)
    assert len(compilations) == 1
    assert read.rows(second)
    assert read.rows(first)
    assert len(compilations) == 1


def test_the_reference_runtimes_scans_compile_once(compilations: list[str]) -> None:
    # Both scans of an actionable pass: after their first use, no query is compiled for them.
    first, second = (HostFactory.build(pk=pk) for pk in _ledger())
    reference = ReferenceRuntime()
    for host in (first, second):  # each compiled at most once, whatever ran before
        reference.scan_nonterminal(host)
        reference.scan_nonterminal_with_generation(host)
    before = len(compilations)
    scanned = reference.scan_nonterminal(second)
    both = reference.scan_nonterminal_with_generation(first)
    assert len(compilations) == before
    assert [item.thread for item in scanned] == ["a", "t1", "t1"]
    assert both is not None
    assert both[1] == 3


@pytest.mark.parametrize("key", ["1", 1.0, None, True])
def test_a_compiled_read_takes_an_int_key(key: Any) -> None:
    read = CompiledRead(Submission, _payloads)
    with pytest.raises(TypeError, match="key is an int"):
        read.rows(key)


def test_a_read_that_does_not_take_its_key_is_refused() -> None:
    read = CompiledRead(Submission, lambda key: Submission.objects.values_list("pk"))
    with pytest.raises(ValueError, match="does not take its key"):
        read.rows(1)


def test_the_marker_is_no_key() -> None:
    assert compiled.MARKER < 0  # primary keys are positive: no row has it


@pytest.mark.postgres
def test_a_pass_statement_run_often_is_prepared_on_postgresql() -> None:
    # Note [Prepared statements on PostgreSQL] (durable_agent/conf.py): the settings come from
    # recommended_database(), so a scan run more than PREPARE_THRESHOLD times on one
    # connection is planned once, as a prepared statement of that connection.
    from django.db import connection

    from durable_agent.conf import PREPARE_THRESHOLD

    host = HostFactory.build(pk=_ledger()[0])
    reference = ReferenceRuntime()
    for _ in range(PREPARE_THRESHOLD + 1):
        assert [item.thread for item in reference.scan_nonterminal(host)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("durable_agent_submission" in statement for statement in prepared), prepared


#: A retry recorded on a state row (all four fields or none): a timestamp that is not NULL.
RETRY = {
    "retry_generation": 1,
    "retry_not_before": T0,
    "retry_native_only": False,
    "retry_stalls": 1,
}


def test_reading_gives_the_orms_datetimes_with_the_same_tzinfo() -> None:
    # Note [Timestamps read by psycopg's own loader]: the values and their tzinfo, NULLs too.

    from durable_agent.maintenance.store.rows import lock_state_row

    hosts = _ledger()
    read = CompiledRead(Submission, _payloads)
    for host in hosts:
        ours = [row[2:4] for row in read.rows(host)]
        orms = [row[2:4] for row in _payloads(host)]
        assert ours == orms
        assert [[v and v.tzinfo for v in row] for row in ours] == [
            [v and v.tzinfo for v in row] for row in orms
        ]
        MaintenanceState.objects.filter(host_id=host).update(**RETRY)
        state = lock_state_row(host)
        orm = MaintenanceState.objects.get(host_id=host)
        assert state is not None
        for name in ("retry_not_before", "updated_at", "pass_lease_expires_at"):
            assert getattr(state, name) == getattr(orm, name), name
            assert repr(getattr(state, name)) == repr(getattr(orm, name)), name
    assert any(row[1] for host in hosts for row in read.rows(host))  # a NULL and a value seen


@pytest.mark.postgres
def test_reading_parses_timestamps_without_djangos_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    # Django's loader (pure Python, then given Django's UTC) is not called for the reads of
    # this module and the alarm transaction; a cursor of Django's own still calls it.
    from django.db import connection
    from django.db.backends.postgresql import psycopg_any

    from durable_agent.maintenance.store.rows import load_lanes_and_tickets, lock_state_row

    calls: list[bytes] = []
    original = psycopg_any.BaseTzLoader.load

    def counted(self: Any, data: Any) -> Any:
        calls.append(bytes(data))
        return original(self, data)

    monkeypatch.setattr(psycopg_any.BaseTzLoader, "load", counted)
    first = _ledger()[0]
    MaintenanceState.objects.filter(host_id=first).update(**RETRY)
    DueLane.objects.create(host_id=first, lane="x", due_at=T0, not_before=T0)
    calls.clear()
    assert CompiledRead(Submission, _payloads).rows(first)
    state = lock_state_row(first)
    assert state is not None
    assert state.retry_not_before == T0
    read = load_lanes_and_tickets(first)
    assert [(lane.due_at, lane.not_before) for lane in read.lanes] == [(T0, T0)]
    assert read.host is not None
    assert read.host.created_at is not None
    assert calls == []
    with connection.cursor() as cursor:  # the count can see a call
        cursor.execute("SELECT now()")
        cursor.fetchone()
    assert len(calls) == 1


def _read_back(model: Any, pk: Any) -> Any:
    """``model``'s row ``pk`` read through :class:`compiled.Columns`, as the pass reads it."""
    from django.db import connection

    columns = compiled.Columns.cached(model, connection)
    quote = connection.ops.quote_name
    with compiled.reading(connection) as cursor:
        cursor.execute(
            f"SELECT {', '.join(columns.sql)} FROM {quote(model._meta.db_table)}"
            f" WHERE {quote(model._meta.pk.column)} = %s",
            [pk],
        )
        return columns.instance(cursor.fetchone(), connection)


def _same_instance(ours: Any, orms: Any) -> None:
    assert type(ours) is type(orms)
    for field in type(orms)._meta.concrete_fields:
        assert getattr(ours, field.attname) == getattr(orms, field.attname), field.attname
        assert repr(getattr(ours, field.attname)) == repr(getattr(orms, field.attname))
    assert (ours._state.adding, ours._state.db) == (orms._state.adding, orms._state.db)
    assert ours.pk == orms.pk
    assert ours == orms


def test_a_columns_instance_is_the_orms_without_model_init(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Note [An instance without Model.__init__]: the state row, the host, the slot and a
    # submission read back equal the ORM's, field by field, without Model.__init__.
    from django.db.models import Model
    from django_q.models import Schedule

    from durable_agent.maintenance import ensure_alarm
    from durable_agent.models import Host

    host_id = _ledger()[0]
    ensure_alarm(host_id)  # dirty above processed: the slot is armed
    MaintenanceState.objects.filter(host_id=host_id).update(**RETRY)
    host = Host.objects.get(pk=host_id)
    assert host.alarm_id is not None
    rows = [
        (MaintenanceState, host_id),
        (Host, host_id),
        (Schedule, host.alarm_id),
        *(
            (Submission, pk)
            for pk in Submission.objects.filter(host_id=host_id).values_list("pk", flat=True)
        ),
    ]
    inits: list[type] = []
    original = Model.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        inits.append(type(self))
        original(self, *args, **kwargs)

    for model, pk in rows:
        orms = model.objects.get(pk=pk)
        monkeypatch.setattr(Model, "__init__", counted)
        ours = _read_back(model, pk)
        monkeypatch.setattr(Model, "__init__", original)
        _same_instance(ours, orms)
        assert ours.pk == pk
    assert inits == []
    # what it reads back is a working instance: a related object, a save, a refresh
    submission = _read_back(Submission, rows[-1][1])
    assert submission.thread.host_id == host_id
    submission.approval_reason = "kept"
    submission.save(update_fields=["approval_reason"])
    assert Submission.objects.get(pk=submission.pk).approval_reason == "kept"


def test_a_columns_instance_sends_the_init_signals_of_a_receiver_connected_later() -> None:
    from django.db.models.signals import post_init, pre_init

    host_id = _ledger()[0]
    seen: list[Any] = []

    def pre(sender: Any, **kwargs: Any) -> None:
        seen.append(("pre", sender))

    def post(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(("post", sender, instance.host_id))

    _read_back(MaintenanceState, host_id)  # the model's way is found before the receivers
    for signal, receiver in ((pre_init, pre), (post_init, post)):
        signal.connect(receiver, sender=MaintenanceState)
        try:
            orms = MaintenanceState.objects.get(pk=host_id)
            seen.clear()
            ours = _read_back(MaintenanceState, host_id)
        finally:
            signal.disconnect(receiver, sender=MaintenanceState)
        _same_instance(ours, orms)
        sent = (
            ("pre", MaintenanceState) if signal is pre_init else ("post", MaintenanceState, host_id)
        )
        assert seen == [sent]
