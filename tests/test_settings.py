"""The example project's settings: DEBUG, SECRET_KEY and persistent connections by process."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from project.settings import PERSISTENT_CONN_MAX_AGE, conn_max_age, local_secret_key

ROOT = Path(__file__).resolve().parent.parent
PG = "postgres://postgres@127.0.0.1:5432/settings_only"  # parsed, never connected to
PROBE = """
import json, sys
sys.argv = json.loads(sys.argv[1])
from django.conf import settings
print(json.dumps({
    "conn_max_age": settings.DATABASES["default"]["CONN_MAX_AGE"],
    "debug": settings.DEBUG,
    "secret_key": settings.SECRET_KEY,
}))
"""


def load(argv: list[str], module: str = "project.settings", **environ: str) -> dict[str, Any]:
    """The settings ``module`` as a process started with ``argv`` and ``environ`` sees them."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DJANGO_DEBUG", "DJANGO_SECRET_KEY", "DJANGO_CONN_MAX_AGE"}
    }
    env.update({"DJANGO_SETTINGS_MODULE": module, "DATABASE_URL": PG, **environ})
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_settings__persistent_connections_only_in_the_cluster() -> None:
    assert load(["manage.py", "qcluster"])["conn_max_age"] == 600
    assert load(["manage.py", "runserver", "127.0.0.1:8000"])["conn_max_age"] == 0
    assert load(["manage.py", "migrate"])["conn_max_age"] == 0
    assert load(["gunicorn", "project.wsgi"])["conn_max_age"] == 0
    # a WSGI server whose worker threads are reused asks for them
    assert load(["gunicorn", "project.wsgi"], DJANGO_CONN_MAX_AGE="300")["conn_max_age"] == 300


def test_settings__the_benchmarks_keep_persistent_connections_but_not_in_runserver() -> None:
    bench = "bench.settings"
    assert load(["manage.py", "qcluster"], bench, BENCH_DATABASE_URL=PG)["conn_max_age"] == 600
    assert load(["-m", "bench.throughput"], bench, BENCH_DATABASE_URL=PG)["conn_max_age"] == 600
    assert load(["manage.py", "runserver"], bench, BENCH_DATABASE_URL=PG)["conn_max_age"] == 0


def test_settings__debug_is_off_unless_asked() -> None:
    assert load(["manage.py", "runserver"])["debug"] is False
    assert load(["manage.py", "runserver"], DJANGO_DEBUG="1")["debug"] is True


def test_settings__the_secret_key_comes_from_the_environment_or_a_local_file() -> None:
    assert load(["manage.py", "check"], DJANGO_SECRET_KEY="k" * 60)["secret_key"] == "k" * 60
    first = load(["manage.py", "check"])["secret_key"]
    assert first == load(["manage.py", "runserver"])["secret_key"]  # every process, one key
    assert len(first) >= 50
    assert "not-secret" not in first


def test_conn_max_age__the_rule() -> None:
    assert conn_max_age(["manage.py", "qcluster"], {}) == PERSISTENT_CONN_MAX_AGE
    assert conn_max_age(["manage.py", "runserver"], {}, default=600) == 0
    assert conn_max_age(["manage.py"], {}) == 0
    assert conn_max_age(["bench"], {}, default=600) == 600
    assert conn_max_age(["manage.py", "qcluster"], {"DJANGO_CONN_MAX_AGE": "0"}) == 0


def test_local_secret_key__generated_once_private_and_checked(tmp_path: Path) -> None:
    path = tmp_path / ".secret_key"
    key = local_secret_key(path)
    assert local_secret_key(path) == key
    assert len(key) >= 50
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [".secret_key"]  # no temporary file left

    path.write_text("short\n")
    with pytest.raises(ImproperlyConfigured, match="no usable key"):
        local_secret_key(path)
    with pytest.raises(ImproperlyConfigured, match="Set DJANGO_SECRET_KEY"):
        local_secret_key(tmp_path / "missing-dir" / ".secret_key")
