"""Run Python code in a separate process against the current test database."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def database_url() -> str:
    s = connection.settings_dict
    if connection.vendor != "postgresql":
        raise RuntimeError("Separate processes share only a PostgreSQL test database")
    user = s.get("USER") or "postgres"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


def listeners() -> int:
    """How many connections LISTEN for the alarm brokers in the test database (one per
    listening cluster: ``AlarmListener`` sends ``LISTEN_SQL`` once)."""
    from durable_agent import alarm_listener

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = %s",
            [alarm_listener.LISTEN_SQL],
        )
        return int(cursor.fetchone()[0])


def run_python(code: str, *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` after ``django.setup()`` in a child process on the test database."""
    prelude = "import django\ndjango.setup()\n"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "project.settings",
    }
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
