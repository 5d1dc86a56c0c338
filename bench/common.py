"""Shared helpers for the benchmark scripts (PostgreSQL only).

Every script: ``python -m bench.<name>``. The database named by ``BENCH_DATABASE_URL``
(default ``postgres://postgres@127.0.0.1:5432/durable_agent_bench``) is dropped and created
afresh, migrated, and wiped of durable_agent and django-q rows before each scenario.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
os.environ.setdefault("DJANGO_DEBUG", "0")


def setup() -> None:
    """Create the database afresh, set Django up and migrate."""
    import dj_database_url
    import psycopg

    url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/durable_agent_bench"
    )
    config = dj_database_url.parse(url)
    admin = psycopg.connect(
        host=config["HOST"] or "127.0.0.1",
        port=config["PORT"] or 5432,
        user=config["USER"] or "postgres",
        dbname="postgres",
        autocommit=True,
    )
    with admin:  # a fresh database every run: nothing left over from an older schema
        admin.execute(f'DROP DATABASE IF EXISTS "{config["NAME"]}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{config["NAME"]}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def reset() -> None:
    """Delete every row the benchmarks create."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE durable_agent_host, django_q_schedule, django_q_ormq, django_q_task "
            "RESTART IDENTITY CASCADE"
        )
        cursor.execute("ANALYZE")


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Render a Markdown table (also readable as plain text) and print it."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    lines = [f"### {title}", "", "| " + " | ".join(headers) + " |"]
    lines.append("| " + " | ".join("---" for _ in headers) + " |")
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    return text


def machine() -> str:
    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"Django {django.get_version()}, PostgreSQL {pg}"
    )


@contextmanager
def cluster(
    *, fast: bool = True, workers: int = 2, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """A live ``manage.py qcluster`` subprocess on the bench database; stopped with SIGTERM.

    ``env`` adds to (or overrides) the cluster's environment, e.g. ``Q_BROKER_CLASS``.

    The cluster records its errors (failed tasks, ERROR log records; bench/faults.py): a
    benchmark injects no faults, so any error ends the benchmark with a non-zero exit.
    """
    from django.db import connections

    from bench import faults

    connections.close_all()
    errors = tempfile.mkdtemp(prefix="bench-cluster-")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "Q_WORKERS": str(workers),
        "Q_BROKER_CLASS": "durable_agent.broker.AlarmBroker" if fast else "",
        "BENCH_ERROR_DIR": errors,
        "SOAK_SOURCE": "cluster",
        **(env or {}),
    }
    log = open(ROOT / "bench" / "qcluster.log", "a")  # noqa: SIM115  (closed below)
    process = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a hung stop is killed whole
    )
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
    recorded = faults.read(errors)
    if recorded:
        for row in recorded[:5]:
            print(f"{row['source']}: {row['kind']}: {row['message'][-500:]}", file=sys.stderr)
        kinds = sorted({row["kind"] for row in recorded})
        raise SystemExit(f"the cluster recorded {len(recorded)} errors ({kinds}); see {errors}")
    shutil.rmtree(errors, ignore_errors=True)


def wait_for(predicate: Any, *, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate()`` until it is true or ``timeout`` seconds passed."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
