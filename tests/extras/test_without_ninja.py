"""Everything outside the HTTP API works without django-ninja (the ``api`` extra).

``test_core__runs_without_ninja`` runs the core smoke tests and this module's own
``api_token`` test in a fresh pytest process in which ``import ninja`` fails
(``-p tests.extras.no_ninja``); in the ordinary run the ``api_token`` test runs with ninja.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]
NINJA_BLOCKED = any(type(f).__name__ == "NoNinja" for f in sys.meta_path)

CORE_SMOKE = [
    "tests/maintenance/passes/test_smoke.py",
    "tests/test_demo.py",
    "tests/commands/test_maintenance_pass.py",
    "tests/extras/test_without_ninja.py::test_api_token__without_the_api_extra",
]


@pytest.mark.django_db
def test_api_token__without_the_api_extra() -> None:
    out = StringIO()
    call_command("api_token", "create", "ci", "--scope", "read", stdout=out)
    assert out.getvalue().strip().splitlines()[-1].startswith("da_")
    out = StringIO()
    call_command("api_token", "list", "--json", stdout=out)
    assert [row["name"] for row in json.loads(out.getvalue())] == ["ci"]
    call_command("api_token", "revoke", "ci", stdout=StringIO())
    if NINJA_BLOCKED:
        assert "ninja" not in sys.modules
        with pytest.raises(ModuleNotFoundError, match=r"the 'api' extra"):
            from durable_agent.api import router  # noqa: F401


def test_core__runs_without_ninja() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PYTEST_ADDOPTS")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.extras.no_ninja", *CORE_SMOKE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
