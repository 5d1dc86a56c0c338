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
from durable_agent.models import MaintenanceState, Submission, SubmissionState
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
