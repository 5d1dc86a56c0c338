from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from durable_agent import lanes
from durable_agent.maintenance import alarm, gate
from durable_agent.models import Host, PassRecord
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("maintenance_pass", *args, stdout=out)
    return out.getvalue()


def test_command__one_line_per_host(clock: FakeClock, runtime: ScriptedRuntime) -> None:
    a = Host.objects.create(key="a")
    Host.objects.create(key="b")
    item = runtime.submit(a, "t1")
    out = run("--host", "a", "--host", "b")
    assert item.settled
    lines = out.strip().splitlines()
    assert lines[0].startswith("a: actionable settled=1 recovered=0 nonterminal=0 alarm=cleared")
    assert lines[1].startswith("b: ")
    assert PassRecord.objects.count() == 2


def test_command__json_reports(clock: FakeClock, runtime: ScriptedRuntime) -> None:
    a = Host.objects.create(key="a")
    runtime.submit(a, "t1")
    data = json.loads(run("--host", "a", "--json"))
    assert data["failed"] == 0
    (report,) = data["passes"]
    assert report == {
        "ok": True,
        "host": "a",
        "phase": "actionable",
        "recovered": 0,
        "settled": 1,
        "nonterminal": 0,
        "alarm": "cleared",
        "generation": report["generation"],
        "lateness_ms": None,
    }
    assert isinstance(report["generation"], int)


def test_command__unknown_host_is_an_error_before_anything_runs(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    Host.objects.create(key="a")
    with pytest.raises(CommandError, match="Unknown host key"):
        run("--host", "a", "--host", "nope")
    assert PassRecord.objects.count() == 0


def test_command__needs_a_selection(db: None) -> None:
    with pytest.raises(CommandError, match="Name hosts"):
        run()
    with pytest.raises(CommandError, match="cannot be combined"):
        run("--all", "--due")


def test_command__due_and_all(clock: FakeClock, runtime: ScriptedRuntime) -> None:
    due = Host.objects.create(key="due")
    later = Host.objects.create(key="later")
    lanes.register("outbox", lambda ctx: None)
    for host in (due, later):
        caught_up(host)
    gate.schedule(due, "outbox", clock.now())
    gate.schedule(later, "outbox", clock.now() + timedelta(hours=1))
    clock.advance(seconds=1)
    out = run("--due")
    assert out.startswith("due: ")
    assert "later" not in out
    out = run("--all")
    assert "due: " in out
    assert "later: " in out


def test_command__a_failed_pass_exits_1_with_the_error(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host = Host.objects.create(key="broken")
    caught_up(host)
    gate.schedule(host, "no-handler", clock.now())
    out = StringIO()
    with pytest.raises(CommandError) as info:
        call_command("maintenance_pass", "--host", "broken", "--json", stdout=out)
    assert info.value.returncode == 1
    data = json.loads(out.getvalue())
    assert data["failed"] == 1
    assert "No handler registered for scheduled lane: no-handler" in data["passes"][0]["error"]
    assert alarm.scheduled(host) is not None


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--host", "nosuch"], "Unknown host key(s): nosuch"),
        ([], "Name hosts with --host KEY, or use --due or --all"),
        (["--all", "--due"], "--all cannot be combined with --host or --due"),
    ],
)
def test_command__json_errors_are_json(args: list[str], error: str) -> None:
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("maintenance_pass", *args, "--json", stdout=out)
    assert raised.value.returncode == 1
    assert json.loads(out.getvalue()) == {"passes": [], "failed": 0, "error": error}


def test_command__every_option_has_help() -> None:
    from durable_agent.management.commands.maintenance_pass import Command

    parser = Command().create_parser("manage.py", "maintenance_pass")
    ours = [a for a in parser._actions if a.dest in ("host", "due", "all", "json")]
    assert len(ours) == 4
    assert all(action.help for action in ours)
