"""OpenTelemetry spans around the pass, each lane wave and gate.transaction."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from durable_agent import lanes, observability
from durable_agent.errors import describe_error
from durable_agent.maintenance import gate, run_pass
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.models import Host
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db


def test_spans__a_pass_holds_a_span_per_lane_wave(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, spans: InMemorySpanExporter
) -> None:
    lanes.register("outbox", lambda ctx: None)
    lanes.register("mailer", lambda ctx: None)
    caught_up(host)
    spans.clear()
    gate.schedule(host, "outbox", clock.now())
    gate.schedule(host, "mailer", clock.now())
    spans.clear()

    report = run_pass(host)

    finished = spans.get_finished_spans()
    [pass_span] = [s for s in finished if s.name == "durable_agent.pass"]
    waves = [s for s in finished if s.name == "durable_agent.wave"]
    assert pass_span.attributes == {
        "durable_agent.host_key": host.key,
        "durable_agent.phase": report.phase,
    }
    assert sorted(s.attributes["durable_agent.lane"] for s in waves) == ["mailer", "outbox"]
    assert {s.attributes["durable_agent.host_key"] for s in waves} == {host.key}
    assert {s.parent.span_id for s in waves} == {pass_span.context.span_id}


def test_spans__a_failed_pass_records_its_error(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, spans: InMemorySpanExporter
) -> None:
    def broken(ctx: object) -> None:
        raise ValueError("lane exploded")

    lanes.register("outbox", broken)
    caught_up(host)
    gate.schedule(host, "outbox", clock.now())
    spans.clear()
    with pytest.raises(ValueError, match="lane exploded"):
        run_pass(host)
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert by_name["durable_agent.pass"].status.status_code == StatusCode.ERROR
    assert by_name["durable_agent.wave"].status.status_code == StatusCode.ERROR
    assert [e.name for e in by_name["durable_agent.pass"].events] == ["exception"]


class _UnreadableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


def test_spans__an_error_whose_str_raises_is_recorded_by_its_description(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, spans: InMemorySpanExporter
) -> None:
    def broken(ctx: object) -> None:
        raise _UnreadableError()

    lanes.register("outbox", broken)
    caught_up(host)
    gate.schedule(host, "outbox", clock.now())
    spans.clear()
    with pytest.raises(_UnreadableError) as raised:
        run_pass(host)
    # the lane's failure, not the RuntimeError its __str__ raises while a span records it
    assert "could not be read: RuntimeError" in describe_error(raised.value)
    pass_span = {s.name: s for s in spans.get_finished_spans()}["durable_agent.pass"]
    assert pass_span.status.status_code == StatusCode.ERROR
    [event] = pass_span.events
    assert event.attributes["exception.message"] == (
        "_UnreadableError: (the message of this _UnreadableError could not be read: RuntimeError)"
    )


def test_spans__gate_transaction(host: Host, clock: FakeClock, spans: InMemorySpanExporter) -> None:
    with gate.transaction(host) as tx:
        tx.record_progress([NATIVE])
        with gate.transaction(host):
            pass
    finished = [s for s in spans.get_finished_spans() if s.name == "durable_agent.gate.transaction"]
    assert [s.attributes["durable_agent.host_id"] for s in finished] == [host.pk, host.pk]
    inner, outer = finished
    assert inner.parent.span_id == outer.context.span_id


def test_spans__a_no_op_without_opentelemetry(
    host: Host, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, spans: InMemorySpanExporter
) -> None:
    monkeypatch.setattr(observability, "_trace", None)
    monkeypatch.setattr(observability, "_context", None)
    with observability.span("durable_agent.test", lane="x") as current:
        current.set_attribute("k", "v")
    assert observability.in_current_trace(len) is len
    with gate.transaction(host):
        pass
    assert spans.get_finished_spans() == ()


@pytest.mark.postgres  # SQLite's shared in-memory test database locks across threads
@pytest.mark.threads
@pytest.mark.django_db(transaction=True)
def test_spans__waves_on_the_thread_pool_stay_children_of_the_pass(
    clock: FakeClock, runtime: ScriptedRuntime, spans: InMemorySpanExporter
) -> None:
    import threading

    from durable_agent.maintenance.passes.pool import close_thread_pool
    from tests.factories import HostFactory

    host = HostFactory(key="pooled")
    threads: set[int] = set()
    lanes.register("outbox", lambda ctx: threads.add(threading.get_ident()))
    lanes.register("mailer", lambda ctx: threads.add(threading.get_ident()))
    caught_up(host)
    gate.schedule(host, "outbox", clock.now())
    gate.schedule(host, "mailer", clock.now())
    spans.clear()
    try:
        run_pass(host)
    finally:
        close_thread_pool()
    assert threading.get_ident() not in threads  # the waves ran on the pool
    finished = spans.get_finished_spans()
    [pass_span] = [s for s in finished if s.name == "durable_agent.pass"]
    waves = [s for s in finished if s.name == "durable_agent.wave"]
    assert len(waves) == 2
    assert {s.parent.span_id for s in waves} == {pass_span.context.span_id}


def test_spans__none_are_made_until_a_tracer_provider_is_installed(
    monkeypatch: pytest.MonkeyPatch, spans: InMemorySpanExporter
) -> None:
    # Note [No span without a tracer provider]: the API's proxy provider (none installed)
    # gets no span made at all; the installed provider gets every span.
    from opentelemetry import trace

    installed = trace.get_tracer_provider()
    asked: list[str] = []

    class Refusing:
        def start_as_current_span(self, name: str, **_: object) -> object:
            asked.append(name)
            raise AssertionError("no span is made without a tracer provider")

    monkeypatch.setattr(observability, "_tracer", lambda: Refusing())
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    with observability.span("durable_agent.pass", host_key="h") as current:
        current.set_attribute("durable_agent.phase", "caught-up")
    assert asked == []

    monkeypatch.undo()
    assert trace.get_tracer_provider() is installed
    spans.clear()
    with observability.span("durable_agent.pass", host_key="h") as current:
        current.set_attribute("durable_agent.phase", "caught-up")
    [made] = spans.get_finished_spans()
    assert made.attributes == {
        "durable_agent.host_key": "h",
        "durable_agent.phase": "caught-up",
    }
