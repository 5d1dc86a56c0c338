from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_agent.agents import registry
from tests.hostile import cases


@pytest.fixture
def runs_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file every hostile agent and lane appends ``run <name>`` to."""
    path = tmp_path / "runs"
    monkeypatch.setenv(cases.RUNS_ENV, str(path))
    return path


@pytest.fixture(autouse=True)
def hostile_cases() -> Iterator[None]:
    """Every case's agent and lane registered (the lanes are restored by tests/conftest.py)."""
    saved = registry.snapshot()
    registry.restore({})
    cases.register()
    yield
    registry.restore(saved)
