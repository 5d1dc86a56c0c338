"""``maintenance_pass`` as a real process: lines stream as passes finish, a terminal gets a
count, Ctrl-C sums up, a pass that raises anything is one host's failure (Note [Passes
stream] in durable_agent/management/commands/maintenance_pass.py)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from durable_agent import clock as real_clock
from durable_agent import lanes
from durable_agent.maintenance import gate
from durable_agent.models import Host
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.maintenance.helpers import caught_up
from tests.procs import ROOT, database_url

# The child registers a quick lane and one that holds its pass until a file appears.
CHILD = """
import os, sys, time
import django
django.setup()
from pathlib import Path
from django.core.management import execute_from_command_line
from durable_agent import lanes

release = Path(os.environ["RELEASE"])

def slow(ctx):
    deadline = time.monotonic() + 30
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)

lanes.register("quick", lambda ctx: None)
lanes.register("slow", slow)
execute_from_command_line(["manage.py", "maintenance_pass", *sys.argv[1:]])
"""


def _hosts(now: datetime, plan: dict[str, str]) -> None:
    """Hosts with one due lane each (``now``: the real time for a child process)."""
    for key, lane in plan.items():
        host = Host.objects.create(key=key)
        caught_up(host)
        gate.schedule(host, lane, now)


def _child(
    tmp_path: Path, *args: str, stderr: int | None = subprocess.PIPE
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "RELEASE": str(tmp_path / "release"),
    }
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), "--all", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
    )


def _read_line(child: subprocess.Popen[bytes], timeout: float = 20) -> str:
    """The child's next stdout line, failing if none arrives in ``timeout`` seconds."""
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], timeout)
    assert ready, f"no line within {timeout} s"
    return child.stdout.readline().decode()


@pytest.fixture
def release(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "release"
    (tmp_path / "release").touch()  # never leave a child waiting


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_pass__lines_stream_as_each_pass_finishes(tmp_path: Path, release: Path) -> None:
    _hosts(real_clock.now(), {"a": "quick", "b": "slow", "c": "quick"})
    child = _child(tmp_path)
    try:
        first = _read_line(child)
        assert first.startswith("a: ")
        time.sleep(0.5)
        assert child.poll() is None  # b's pass still holds: a's line came before it ended
        assert child.stdout is not None
        assert not select.select([child.stdout], [], [], 0)[0]
        release.touch()
        rest = child.communicate(timeout=60)[0].decode().splitlines()
    finally:
        child.kill()
    assert [line.split(":")[0] for line in rest] == ["b", "c"]
    assert child.returncode == 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_pass__ctrl_c_sums_up_the_passes_already_run(tmp_path: Path, release: Path) -> None:
    _hosts(real_clock.now(), {"a": "quick", "b": "slow", "c": "quick"})
    child = _child(tmp_path)
    try:
        first = _read_line(child)
        time.sleep(0.5)  # b's pass has started and waits
        child.send_signal(signal.SIGINT)
        time.sleep(0.3)
        release.touch()  # a lane in the pass's pool thread ends; the process exits
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130, err.decode()[-3000:]
    assert first.startswith("a: ")
    assert out == b""  # nothing after a's line: b's pass was cut short, c never ran
    assert err.decode().splitlines()[-1] == (
        "CommandError: Interrupted after 1 of 3 passes, 0 failed (the pass of b was cut short)"
    )
    assert "Traceback" not in err.decode()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_pass__ctrl_c_with_json_prints_the_passes_already_run(
    tmp_path: Path, release: Path
) -> None:
    _hosts(real_clock.now(), {"a": "quick", "b": "slow", "c": "quick"})
    child = _child(tmp_path, "--json")
    try:
        deadline = time.monotonic() + 30
        while not Host.objects.get(key="a").pass_records.exists():
            assert time.monotonic() < deadline, "a's pass never ran"
            time.sleep(0.05)
        time.sleep(0.3)  # b's pass has started and waits
        child.send_signal(signal.SIGINT)
        time.sleep(0.3)
        release.touch()  # a lane in the pass's pool thread ends; the process exits
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130, err.decode()[-3000:]
    data = json.loads(out)
    assert data["interrupted"] is True
    assert data["hosts"] == 3
    assert [report["host"] for report in data["passes"]] == ["a"]
    assert err.decode().splitlines()[-1].startswith("CommandError: Interrupted after 1 of 3")
    assert "Traceback" not in err.decode()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_pass__a_terminal_gets_a_count(tmp_path: Path, release: Path) -> None:
    _hosts(real_clock.now(), {"a": "quick", "b": "quick"})
    release.touch()
    leader, follower = pty.openpty()
    child = _child(tmp_path, stderr=follower)
    os.close(follower)
    try:
        out = child.communicate(timeout=60)[0].decode()
        seen = b""
        while select.select([leader], [], [], 1)[0]:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        child.kill()
        os.close(leader)
    assert child.returncode == 0
    assert [line.split(":")[0] for line in out.splitlines()] == ["a", "b"]
    assert b"\r[1/2]" in seen
    assert b"\r[2/2]" in seen
    assert seen.endswith(b"\r\x1b[K")  # the count is wiped at the end


class Escape(BaseException):
    """Not an Exception: what a TaskGroup or a hostile agent lets out."""


@pytest.mark.django_db
def test_pass__a_pass_that_raises_anything_fails_its_host_and_the_next_runs(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    def escape(ctx: object) -> None:
        raise BaseExceptionGroup("unhandled errors in a TaskGroup", [Escape("out")])

    lanes.register("escape", escape)
    lanes.register("quick", lambda ctx: None)
    _hosts(clock.now(), {"a": "escape", "b": "quick"})
    out = StringIO()
    with pytest.raises(CommandError, match="1 of 2 passes failed"):
        call_command("maintenance_pass", "--all", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("a: FAILED ")
    assert "unhandled errors in a TaskGroup" in lines[0]
    assert lines[1].startswith("b: caught-up") or lines[1].startswith("b: actionable")


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


@pytest.mark.django_db
def test_pass__an_error_whose_str_raises_is_named_by_its_type(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    def bad(ctx: object) -> None:
        raise BadStr()

    lanes.register("bad", bad)
    _hosts(clock.now(), {"a": "bad"})
    out = StringIO()
    with pytest.raises(CommandError, match="1 of 1 passes failed"):
        call_command("maintenance_pass", "--all", "--json", stdout=out)
    (report,) = json.loads(out.getvalue())["passes"]
    assert report["ok"] is False
    assert "BadStr" in report["error"]
