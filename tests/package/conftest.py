"""The built distribution: ``python -m build`` once per session.

``make test`` builds it once in its own leg (scripts/test.sh) and passes the directory in
``DA_DIST_DIR``; without it the first test that needs it builds into a temporary directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def dist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("DA_DIST_DIR")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


@pytest.fixture(scope="session")
def wheel(dist_dir: Path) -> Path:
    (found,) = dist_dir.glob("durable_agent-*.whl")
    return found
