"""The Prometheus scrape view: pass metrics and the fleet gauges read from the database."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test import Client, TestCase
from prometheus_client.parser import text_string_to_metric_families

from durable_agent import lanes
from durable_agent.errors import LaneNotRegistered
from durable_agent.maintenance import alarm, gate, run_pass
from durable_agent.models import DueLane, Host
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.agents.test_services import make
from tests.factories import HostFactory
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``GET /internal/metrics``, by (name, sorted labels)."""
    response = Client().get("/internal/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def counted_pass(host: Host, **kwargs: Any) -> Any:
    """``run_pass``, then its on-commit callbacks: the pass metrics hear ``pass_finished``,
    sent when the pass's record commits (the test's own transaction never commits)."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        return run_pass(host, **kwargs)


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_scrape__counts_passes_by_phase_with_duration_and_lateness(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    before = scrape()
    runtime.submit(host, "t1")
    deadline = clock.now()
    clock.advance(seconds=2)
    counted_pass(host, deadline=deadline)
    caught_up(host)
    gate.schedule(host, "orphan", clock.now())
    with pytest.raises(LaneNotRegistered):
        counted_pass(host)
    after = scrape()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("durable_agent_passes_total", phase="actionable") == 1
    assert delta("durable_agent_passes_total", phase="failed") == 1
    assert delta("durable_agent_pass_duration_seconds_count") >= 2
    assert delta("durable_agent_pass_lateness_seconds_count") == 1
    assert delta("durable_agent_pass_lateness_seconds_sum") == 2.0
    assert delta("durable_agent_pass_lateness_seconds_bucket", le="1.0") == 0
    assert delta("durable_agent_pass_lateness_seconds_bucket", le="2.5") == 1


def test_scrape__fleet_gauges_read_the_database(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    overdue = HostFactory(key="overdue")
    alarm.rearm(overdue, at=clock.now() - timedelta(minutes=2), actor="t", reason="arm")
    parked = HostFactory(key="parked")
    DueLane.objects.create(host=parked, lane="stuck", state="parked", stalls=8, due_at=None)
    make(parked)  # one owed submission
    caught_up(host)
    gate.schedule(host, "orphan", clock.now())
    for _ in range(3):  # failing: its last FAILING_AFTER_PASSES passes failed
        clock.advance(seconds=5)
        with pytest.raises(LaneNotRegistered):
            run_pass(host)  # re-armed with a backoff

    samples = scrape()

    assert value(samples, "durable_agent_hosts") == 3
    assert value(samples, "durable_agent_hosts_armed") == 2
    assert value(samples, "durable_agent_hosts_overdue") == 1
    assert value(samples, "durable_agent_hosts_failing") == 1
    assert value(samples, "durable_agent_lanes_parked") == 1
    assert value(samples, "durable_agent_submissions_owed") == 1


def test_scrape__without_the_database_serves_the_pass_metrics_and_fleet_up_0(
    host: Host,
    clock: FakeClock,
    runtime: ScriptedRuntime,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from durable_agent.contrib.metrics import FleetCollector

    monkeypatch.setattr(FleetCollector, "database_down", False, raising=False)
    runtime.submit(host, "t1")
    counted_pass(host)  # a counted pass: the process counters are not empty
    up = scrape()
    assert value(up, "durable_agent_fleet_up") == 1
    passes = value(up, "durable_agent_passes_total", phase="actionable")
    assert passes >= 1

    def refuse(execute: object, sql: str, params: object, many: bool, context: object) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    caplog.set_level(logging.INFO, logger="durable_agent.metrics")
    with connection.execute_wrapper(refuse):
        down = scrape()
        scrape()  # logged once, not once per scrape
    assert value(down, "durable_agent_fleet_up") == 0
    assert value(down, "durable_agent_passes_total", phase="actionable") == passes
    assert not {name for name, _labels in down} & {
        "durable_agent_hosts",
        "durable_agent_hosts_armed",
    }
    logged = [r for r in caplog.records if r.name == "durable_agent.metrics"]
    assert [getattr(r, "action", "") for r in logged] == ["metrics_fleet_down"]
    assert "server closed the connection" in logged[0].getMessage()

    back = scrape()
    assert value(back, "durable_agent_fleet_up") == 1
    assert value(back, "durable_agent_hosts") == 1
    logged = [r for r in caplog.records if r.name == "durable_agent.metrics"]
    assert [getattr(r, "action", "") for r in logged] == ["metrics_fleet_down", "metrics_fleet_up"]


@pytest.mark.parametrize("hosts", [3, 30])
def test_scrape__fleet_gauges_take_a_constant_number_of_queries(
    db: None, clock: FakeClock, hosts: int, django_assert_num_queries: object
) -> None:
    from durable_agent.maintenance.store.selectors import fleet_snapshot

    for n in range(hosts):
        host = HostFactory(key=f"h{n}")
        alarm.rearm(host, at=clock.now(), actor="t", reason="arm")
    with django_assert_num_queries(4):  # type: ignore[operator]
        snapshot = fleet_snapshot()
    assert (snapshot.hosts, snapshot.armed, snapshot.overdue) == (hosts, hosts, 0)


def test_scrape__a_lane_wave_pass_is_counted(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    lanes.register("outbox", lambda ctx: None)
    caught_up(host)
    before = value(scrape(), "durable_agent_passes_total", phase="actionable")
    gate.schedule(host, "outbox", clock.now())
    counted_pass(host)
    assert value(scrape(), "durable_agent_passes_total", phase="actionable") == before + 1


def test_passes_run_without_prometheus_client(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    import durable_agent.contrib
    from durable_agent import signals
    from durable_agent.models import PassRecord

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    monkeypatch.delitem(sys.modules, "durable_agent.contrib.metrics", raising=False)
    monkeypatch.delattr(durable_agent.contrib, "metrics", raising=False)
    with pytest.raises(ImportError):
        import durable_agent.contrib.metrics
    monkeypatch.setattr(signals.pass_finished, "receivers", [])
    signals.pass_finished.sender_receivers_cache.clear()
    assert not signals.pass_finished.has_listeners(PassRecord)
    runtime.submit(host, "t1")
    assert run_pass(host).phase == "actionable"
    assert "durable_agent.contrib.metrics" not in sys.modules
