"""Every command error is one ``CommandError`` line, JSON with ``--json`` (Note [One error
line per command] in durable_agent/management/commands/_common.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from durable_agent.api.tokens import issue_token
from durable_agent.models import ApiToken, Host, PassRecord
from durable_agent.testing import FakeClock, ScriptedRuntime

ROOT = Path(__file__).resolve().parents[2]
UNDECODABLE = os.fsdecode(b"\xff")  # what Python makes of the argument $'\xff'


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` in its own process group, all of it killed after 60 s (a cluster
    that starts after all must leave no process behind)."""
    child = subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        raise
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


DOWN = {"DATABASE_URL": "postgres://postgres@127.0.0.1:1/nowhere"}


@pytest.mark.parametrize(
    "command",
    [
        ["maintenance_pass", "--all"],
        ["maintenance_pass", "--host", "a"],
        ["maintenance_audit"],
        ["maintenance_audit", "--repair"],
        ["api_token", "list"],
        ["api_token", "revoke", "x"],
        ["api_token", "create", "x", "--scope", "read"],
    ],
)
def test_commands__an_unreachable_database_is_one_line(command: list[str]) -> None:
    result = manage(*command, env=DOWN)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("CommandError: The database is unreachable: ")
    assert "127.0.0.1" in lines[0]


@pytest.mark.parametrize(
    ("command", "keys"),
    [
        (["maintenance_pass", "--all", "--json"], {"passes", "failed", "error"}),
        (["maintenance_audit", "--json"], {"error"}),
        (["api_token", "list", "--json"], {"error"}),
        (["api_token", "revoke", "x", "--json"], {"error"}),
    ],
)
def test_commands__an_unreachable_database_with_json_is_json(
    command: list[str], keys: set[str]
) -> None:
    result = manage(*command, env=DOWN)
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert set(data) == keys
    assert data["error"].startswith("The database is unreachable: ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_commands__an_undecodable_argument_from_the_shell_is_unknown(tmp_path: Path) -> None:
    """Through the real argv: the terminal's byte 0xff reaches the command undecoded."""
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    assert manage("migrate", "-v0", env=env).returncode == 0
    result = subprocess.run(
        [sys.executable.encode(), b"manage.py", b"maintenance_pass", b"--host", b"\xff"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", **env},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr == b"CommandError: Unknown host key(s): \\xff\n"
    result = subprocess.run(
        [sys.executable.encode(), b"manage.py", b"api_token", b"revoke", b"\xff", b"--json"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", **env},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert json.loads(result.stdout)["code"] == "token_not_found"
    assert result.stderr.decode().startswith("CommandError: No active token has this name")
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.django_db
def test_maintenance_pass__an_undecodable_key_is_an_unknown_host(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    Host.objects.create(key="a")
    with pytest.raises(CommandError, match=r"^Unknown host key\(s\): \\xff, nope$"):
        call_command("maintenance_pass", "--host", "a", "--host", UNDECODABLE, "--host", "nope")
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("maintenance_pass", "--host", UNDECODABLE, "--json", stdout=out)
    assert json.loads(out.getvalue()) == {
        "passes": [],
        "failed": 0,
        "error": "Unknown host key(s): \\xff",
    }
    assert PassRecord.objects.count() == 0


@pytest.mark.django_db
def test_api_token__an_undecodable_name_is_an_unknown_token(clock: FakeClock) -> None:
    issue_token(name="ci", scope="read")
    out = StringIO()
    with pytest.raises(CommandError, match="No active token has this name"):
        call_command("api_token", "revoke", UNDECODABLE, "--json", stdout=out)
    assert json.loads(out.getvalue())["code"] == "token_not_found"
    with pytest.raises(CommandError, match="token name is 1-100"):
        call_command("api_token", "create", UNDECODABLE, "--scope", "read")
    assert ApiToken.objects.active().count() == 1


@pytest.mark.django_db
def test_api_token__errors_with_json_are_json(clock: FakeClock) -> None:
    issue_token(name="ci", scope="read")
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("api_token", "create", "ci", "--scope", "read", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data == {"error": str(raised.value), "code": "token_name_taken"}
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("api_token", "revoke", "nope", "--json", stdout=out)
    assert json.loads(out.getvalue())["code"] == "token_not_found"


def test_qcluster__an_unmigrated_database_says_to_migrate(tmp_path: Path) -> None:
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'empty.sqlite3'}"}
    result = manage("qcluster", env=env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert "(durable_agent.E022) The database 'default' is not migrated" in result.stderr
    assert "Run `manage.py migrate --database default`" in result.stderr


def test_qcluster__an_unreachable_database_is_one_error() -> None:
    result = manage("qcluster", env=DOWN)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert "(durable_agent.E022) qcluster cannot read the migrations" in result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["api_token", "create", "x", "--scope", "nope", "--json"],
        ["maintenance_pass", "--bogus", "--json"],
        ["maintenance_audit", "--json", "--repair", "extra"],
    ],
)
def test_commands__a_usage_error_with_json_is_json_too(command: list[str]) -> None:
    result = manage(*command, env=DOWN)
    assert result.returncode == 2
    assert json.loads(result.stdout)["code"] == "usage"
    assert "error:" in result.stderr  # argparse's own message stays on stderr
