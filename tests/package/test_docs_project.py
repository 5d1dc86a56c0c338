"""The docs run as tests: a brand-new project, built from the README's and
docs/first-agent.md's own snippets, with durable_agent installed from the built wheel into a
fresh virtualenv.

Each case runs ``django-admin startproject``, appends a document's settings block to the new
settings.py, writes the guide's ``billing`` app, migrates, checks, starts a real ``qcluster``,
creates the guide's host, submits its work and waits for the submission to settle: it must
settle in under 2 s, and the cluster's log must hold no "database is locked" and no
traceback. SQLite always; PostgreSQL when DATABASE_URL names one (``make test`` does).
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
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel (and the ``postgres`` extra) installed, the
    dependencies held to requirements/base.txt's pins."""
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    constraints = path / "constraints.txt"
    pins = (ROOT / "requirements" / "base.txt").read_text(encoding="utf-8")
    constraints.write_text(pins.replace("[binary]", ""), encoding="utf-8")
    subprocess.run(
        [
            str(path / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-c",
            str(constraints),
            f"{wheel}[postgres]",
        ],
        check=True,
        timeout=600,
    )
    return path


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


def build_project(venv: Path, where: Path, settings_block: str, database: str) -> Path:
    """``django-admin startproject mysite`` plus the document's snippets; returns its root."""
    where.mkdir()
    subprocess.run(
        [str(venv / "bin" / "django-admin"), "startproject", "mysite", str(where)],
        check=True,
        timeout=60,
    )
    settings = where / "mysite" / "settings.py"
    text = settings.read_text(encoding="utf-8") + database + "\n" + settings_block
    if '"billing"' not in settings_block:
        text += '\nINSTALLED_APPS += ["billing"]  # the guide\'s app\n'
    settings.write_text(text, encoding="utf-8")
    billing = where / "billing"
    billing.mkdir()
    (billing / "__init__.py").write_text("", encoding="utf-8")
    for name, body in docs_snippets.first_agent_files().items():
        (billing / name).write_text(body, encoding="utf-8")
    return where


def run_project(venv: Path, project: Path) -> tuple[dict[str, object], str]:
    """Migrate, check, start a qcluster, submit; the outcome and the cluster's log."""
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL"))}
    env["PYTHONUNBUFFERED"] = "1"

    def manage(*args: str) -> None:
        subprocess.run([python, "manage.py", *args], cwd=project, env=env, check=True, timeout=120)

    manage("migrate", "--verbosity", "0")
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
    finally:
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait()
    return outcome, log_path.read_text()


DOCUMENTS = {
    "readme": docs_snippets.readme_settings,
    "first-agent": docs_snippets.first_agent_settings,
}


def _assert_settled_promptly(outcome: dict[str, object], log: str) -> None:
    assert (outcome["state"], outcome["outcome"]) == ("settled", "completed"), (outcome, log)
    assert outcome["result"] == {"greeting": "Hello, Ada!"}
    assert float(outcome["seconds"]) < SETTLE_LIMIT_S, (outcome, log)  # type: ignore[arg-type]
    assert "database is locked" not in log, log
    assert "Traceback" not in log, log


@pytest.mark.parametrize("document", sorted(DOCUMENTS))
def test_docs__a_new_project_on_sqlite(document: str, venv: Path, tmp_path: Path) -> None:
    project = build_project(venv, tmp_path / "site", DOCUMENTS[document](), "")
    _assert_settled_promptly(*run_project(venv, project))


@pytest.mark.postgres
@pytest.mark.parametrize("document", sorted(DOCUMENTS))
def test_docs__a_new_project_on_postgresql(
    document: str, venv: Path, tmp_path: Path, postgres_database: str
) -> None:
    database = _postgres_settings(postgres_database)
    project = build_project(venv, tmp_path / "site", DOCUMENTS[document](), database)
    _assert_settled_promptly(*run_project(venv, project))


def test_docs__the_snippets_are_found() -> None:
    """Each snippet the project is built from exists exactly once (a renamed one fails here)."""
    assert "recommended_q_cluster(" in docs_snippets.readme_settings()
    assert "recommended_q_cluster(" in docs_snippets.first_agent_settings()
    assert "@durable_agent.agent(" in docs_snippets.first_agent_files()["agents.py"]
    assert "receipt = durable_agent.submit(" in docs_snippets.first_agent_submit()
