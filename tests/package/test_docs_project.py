"""The docs run as tests: a brand-new project, built by following the README's and
docs/first-agent.md's own steps, literally and in their order, with durable_agent installed
from the built wheel into a fresh virtualenv by the README's own command.

``first-agent`` runs the guide's section 1 as written: its shell lines (``django-admin
startproject``, ``cd``, ``startapp billing``; its ``pip install`` line is the README's, run
once for the virtualenv) and its settings block appended to the new settings.py, then its
``migrate`` and ``check``, then writes the guide's ``billing/agents.py``. ``readme`` appends
the README's settings and ``urls.py`` blocks and docs/operations.md's django-health-check
blocks to a new project (with a ``billing`` app of the guide's agent), runs the README's
``migrate``, and then answers HTTP: the admin, the API's offline docs page (``"ninja"``), a
JSON 404 under the API's mount, and the health-check view. Both then start a real
``qcluster``, create the guide's host, submit its work and wait for the submission to
settle: it must settle in under 2 s, and the cluster's log must hold no "database is locked"
and no traceback but the retried attempt's below. Both projects also hold section 14's
``billing/retrying.py`` (imported from ``agents.py`` as its first line says) and run section
14's delayed submission and ``wait`` block in ``manage.py shell -c`` while the cluster runs:
it must print the output its last comment shows (the agent retried once, the work settled).
SQLite always; PostgreSQL when DATABASE_URL names one (``make test`` does).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.package import docs_snippets
from tests.package.conftest import ROOT

SETTLE_LIMIT_S = 2.0

# Run in the new project by its own interpreter: the guide's host and submission, then wait.
SUBMIT_AND_WAIT = """
import json, os, sys, time
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()
{snippets}
submitted = time.monotonic()
from durable_agent.models import Submission
while True:
    s = Submission.objects.get(pk=receipt.submission_id)
    if s.state == "settled" or time.monotonic() - submitted > 30:
        break
    time.sleep(0.01)
print(json.dumps({{"state": s.state, "outcome": s.outcome, "result": s.result,
                  "seconds": time.monotonic() - submitted}}))
"""


@pytest.fixture(scope="session")
def venv(dist_dir: Path, wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv, the wheel installed by the README's own command (run in a directory
    whose ``dist/`` is the built distribution), plus the ``health-check`` extra for
    docs/operations.md; the dependencies held to requirements/'s pins."""
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    constraints = path / "constraints.txt"
    pins = (ROOT / "requirements" / "base.txt").read_text(encoding="utf-8")
    dev = (ROOT / "requirements" / "dev.txt").read_text(encoding="utf-8")
    pins += "".join(line + "\n" for line in dev.splitlines() if "health-check" in line)
    constraints.write_text(pins.replace("[binary]", ""), encoding="utf-8")
    checkout = tmp_path_factory.mktemp("checkout")
    (checkout / "dist").symlink_to(dist_dir)
    env = _shell_env(path) | {"PIP_CONSTRAINT": str(constraints)}
    env |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_QUIET": "1"}
    for command in (docs_snippets.readme_wheel_install(), f'pip install "{wheel}[health-check]"'):
        subprocess.run(["bash", "-ec", command], cwd=checkout, env=env, check=True, timeout=600)
    return path


def _shell_env(venv: Path) -> dict[str, str]:
    """A shell with the virtualenv activated, and no settings of this test run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_shell(venv: Path, cwd: Path, block: str, *, skip: tuple[str, ...] = ()) -> Path:
    """Run a document's shell block line by line, as a reader would; the directory it ends in.

    A line starting with one of ``skip`` is left out (``pip install``: the virtualenv already
    holds the wheel, installed by the README's command)."""
    lines = [line for line in block.splitlines() if not line.startswith(skip)]
    script = "\n".join(["set -e", *lines, "pwd"])
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env=_shell_env(venv),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr}"
    return Path(done.stdout.strip().splitlines()[-1])


def _postgres_settings(name: str) -> str:
    settings = connection.settings_dict
    fields = {k: settings[k] for k in ("HOST", "PORT", "USER", "PASSWORD")}
    fields.update(ENGINE="django.db.backends.postgresql", NAME=name)
    return f"\nDATABASES = {{'default': {fields!r}}}\n"


@pytest.fixture
def postgres_database(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database of its own on the test server for the new project, dropped afterwards."""
    import psycopg

    settings = connection.settings_dict
    name = f"{settings['NAME']}_docs_{request.node.callspec.id}".replace("-", "_").lower()
    server = {
        "host": settings["HOST"],
        "port": settings["PORT"] or None,
        "user": settings["USER"],
        "password": settings["PASSWORD"] or None,
        "dbname": "postgres",
    }

    def execute(sql: str) -> None:
        with psycopg.connect(**server, autocommit=True) as admin:
            admin.execute(sql)  # type: ignore[arg-type]

    execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    execute(f'CREATE DATABASE "{name}"')
    yield name
    execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _append(path: Path, *texts: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + "\n".join(("", *texts)), encoding="utf-8")


def _write_agents(project: Path) -> None:
    for name, body in docs_snippets.first_agent_files().items():
        (project / "billing" / name).write_text(body, encoding="utf-8")


def build_first_agent(venv: Path, where: Path, database: str) -> Path:
    """docs/first-agent.md's section 1, block by block in its order; then its agents.py."""
    where.mkdir()
    cwd = where
    for language, body in docs_snippets.first_agent_setup():
        if language == "sh":
            cwd = run_shell(venv, cwd, body, skip=("pip install",))
        else:
            assert body.startswith("# settings.py"), body
            (settings,) = cwd.glob("*/settings.py")
            _append(settings, database, body)
    _write_agents(cwd)
    return cwd


def build_readme(venv: Path, where: Path, database: str) -> Path:
    """A new project with the README's settings and urls.py blocks and docs/operations.md's
    health-check ones (plus a ``billing`` app holding the guide's agent); the README's
    ``migrate``."""
    where.mkdir()
    start = "django-admin startproject mysite\ncd mysite\npython manage.py startapp billing"
    project = run_shell(venv, where, start)
    health_settings, health_urls = docs_snippets.health_check_snippets()
    _append(
        project / "mysite" / "settings.py",
        database,
        docs_snippets.readme_settings(),
        health_settings,
        'INSTALLED_APPS += ["billing"]  # the guide\'s app\n',
    )
    _append(project / "mysite" / "urls.py", docs_snippets.readme_urls(), health_urls)
    _write_agents(project)
    commands = docs_snippets.readme_commands()
    assert "python manage.py qcluster" in commands  # started below, by run_project
    run_shell(venv, project, commands, skip=("python manage.py qcluster",))
    return project


# Run in the README's project: what its URLs answer.
ANSWERS = """
import json, os
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
client = Client(raise_request_exception=False)  # a 500 shows as its status
admin = client.get("/admin/")
docs = client.get("/api/durable-agent/docs")
missing = client.get("/api/durable-agent/no-such-route")
health = client.get("/ht/", HTTP_ACCEPT="application/json")
page = client.get("/ht/")  # the HTML page needs the health_check app's templates
print(json.dumps({
    "admin": [admin.status_code, admin.get("Location")],
    "docs": [docs.status_code, "/static/ninja/" in docs.content.decode()],
    "missing": [missing.status_code, missing["Content-Type"]],
    "health": [health.status_code, health.json() if health.status_code == 200 else None],
    "health_page": page.status_code,
}))
"""


def readme_answers(venv: Path, project: Path) -> dict[str, object]:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", ANSWERS],
        cwd=project,
        env=_shell_env(venv),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answers: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answers


def build_project(document: str, venv: Path, where: Path, database: str) -> Path:
    if document == "first-agent":
        return build_first_agent(venv, where, database)
    project = build_readme(venv, where, database)
    assert readme_answers(venv, project) == {
        "admin": [302, "/admin/login/?next=/admin/"],
        "docs": [200, True],  # the Swagger page's assets come from "ninja"'s static files
        "missing": [404, "application/json"],  # the JSON 404 under the mount
        "health": [200, {"Database(alias='default')": "OK", "Fleet()": "OK"}],
        "health_page": 200,
    }
    return project


def run_project(venv: Path, project: Path) -> tuple[dict[str, object], str]:
    """Migrate, check, start a qcluster, submit; the outcome and the cluster's log."""
    python = str(venv / "bin" / "python")
    env = _shell_env(venv)

    def manage(*args: str) -> None:
        subprocess.run([python, "manage.py", *args], cwd=project, env=env, check=True, timeout=120)

    manage("migrate", "--verbosity", "0")  # the documents ran it; a no-op here
    manage("check", "--fail-level", "WARNING")
    log_path = project / "qcluster.log"
    with log_path.open("w") as log:
        cluster = subprocess.Popen(
            [python, "manage.py", "qcluster"],
            cwd=project,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "Q Cluster" not in log_path.read_text() or "running" not in log_path.read_text():
            assert cluster.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        script = SUBMIT_AND_WAIT.format(snippets=docs_snippets.first_agent_submit())
        done = subprocess.run(
            [python, "-c", script],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        delayed, _ = docs_snippets.first_agent_delayed_wait()
        shell = subprocess.run(
            [python, "manage.py", "shell", "-c", delayed],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shell.returncode == 0, (shell.stderr, log_path.read_text())
        outcome["delayed"] = shell.stdout.strip().splitlines()[-1]
    finally:
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait()
    return outcome, log_path.read_text()


DOCUMENTS = ("first-agent", "readme")


def _assert_settled_promptly(outcome: dict[str, object], log: str) -> None:
    assert (outcome["state"], outcome["outcome"]) == ("settled", "completed"), (outcome, log)
    assert outcome["result"] == {"greeting": "Hello, Ada!"}
    assert float(outcome["seconds"]) < SETTLE_LIMIT_S, (outcome, log)  # type: ignore[arg-type]
    _, expected = docs_snippets.first_agent_delayed_wait()
    assert outcome["delayed"] == expected, (outcome, log)  # section 14's retried, delayed work
    assert "database is locked" not in log, log
    assert _unexpected_tracebacks(log) == [], log


# The one traceback the log may hold: section 14's agent failing its first attempt, retried.
EXPECTED_FAILURE = "billing.retrying.RateLimited: try again later"


def _unexpected_tracebacks(log: str) -> list[str]:
    """The errors of the log's tracebacks, but for the retried attempt's one."""
    errors, lines = [], log.splitlines()
    for at, line in enumerate(lines):
        if line.startswith("Traceback"):
            ending = (rest for rest in lines[at + 1 :] if not rest.startswith(" "))
            error = next(ending, "<the log ends inside a traceback>")
            if error != EXPECTED_FAILURE:
                errors.append(error)
    return errors


@pytest.mark.parametrize("document", DOCUMENTS)
def test_docs__a_new_project_on_sqlite(document: str, venv: Path, tmp_path: Path) -> None:
    project = build_project(document, venv, tmp_path / "site", "")
    _assert_settled_promptly(*run_project(venv, project))


@pytest.mark.postgres
@pytest.mark.parametrize("document", DOCUMENTS)
def test_docs__a_new_project_on_postgresql(
    document: str, venv: Path, tmp_path: Path, postgres_database: str
) -> None:
    database = _postgres_settings(postgres_database)
    project = build_project(document, venv, tmp_path / "site", database)
    _assert_settled_promptly(*run_project(venv, project))


def test_docs__the_snippets_are_found() -> None:
    """Each snippet the project is built from exists exactly once (a renamed one fails here)."""
    assert "recommended_q_cluster(" in docs_snippets.readme_settings()
    assert "recommended_q_cluster(" in docs_snippets.first_agent_settings()
    files = docs_snippets.first_agent_files()
    assert "@durable_agent.agent(" in files["agents.py"]
    assert files["agents.py"].endswith("from billing import retrying\n")
    assert "retry=RetryPolicy(" in files["retrying.py"]
    delayed, expected = docs_snippets.first_agent_delayed_wait()
    assert "durable_agent.wait(receipt" in delayed
    assert "not_before=" in delayed
    assert expected.startswith("settled completed ")
    assert "receipt = durable_agent.submit(" in docs_snippets.first_agent_submit()
    assert "NinjaAPI(" in docs_snippets.readme_urls()
    assert '"ninja"' in docs_snippets.readme_settings()
    assert docs_snippets.readme_wheel_install().startswith("pip install ")
    shell = [body for lang, body in docs_snippets.first_agent_setup() if lang == "sh"]
    assert "startapp billing" in shell[0]  # before the settings block that lists "billing"
    assert "manage.py migrate" in shell[-1]
