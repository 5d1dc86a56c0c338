"""One log line per pass, and one vocabulary of ``extra`` keys."""

from __future__ import annotations

import logging

import pytest

from durable_agent.errors import LaneNotRegistered
from durable_agent.maintenance import gate, run_pass
from durable_agent.maintenance.passes import report_parked
from durable_agent.models import DueLane, Host
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db


def pass_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == "pass"]


def test_logs__one_info_line_per_pass_with_the_vocabulary(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    runtime.submit(host, "t1")
    deadline = clock.now()
    clock.advance(seconds=1)
    with caplog.at_level(logging.INFO, "durable_agent"):
        run_pass(host, deadline=deadline)
    [line] = pass_lines(caplog)
    assert (line.levelno, line.name) == (logging.INFO, "durable_agent.maintenance")
    assert (line.host_key, line.host_id, line.phase) == (host.key, host.pk, "actionable")  # type: ignore[attr-defined]
    assert (line.settled, line.lateness_ms, line.duration_ms) == (1, 1000, 0)  # type: ignore[attr-defined]
    assert line.getMessage().startswith(f"Pass of host {host.key}: actionable in 0.000 s")


def test_logs__a_failed_pass_is_one_warning_line_with_the_error(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    caught_up(host)
    gate.schedule(host, "orphan", clock.now())
    with caplog.at_level(logging.INFO, "durable_agent"), pytest.raises(LaneNotRegistered):
        run_pass(host)
    [line] = pass_lines(caplog)
    assert (line.levelno, line.phase) == (logging.WARNING, "failed")  # type: ignore[attr-defined]
    assert "LaneNotRegistered" in line.getMessage()


def test_logs__the_parked_notice_names_the_host_by_key_and_id(
    host: Host, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    DueLane.objects.create(host=host, lane="stuck", state="parked", stalls=8, due_at=clock.now())
    with caplog.at_level(logging.INFO, "durable_agent"):
        report_parked(host.pk)
    [line] = [r for r in caplog.records if getattr(r, "action", None) == "lane_parked"]
    assert line.host_id == host.pk  # type: ignore[attr-defined]
    assert not hasattr(line, "host")  # the old key, an id here and a key elsewhere, is gone
