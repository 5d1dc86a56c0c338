from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from durable_agent.models import Host
from durable_agent.testing import FakeClock, fake_clock, fake_random
from tests.factories import T0, HostFactory

_deselected_postgres: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``postgres`` need PostgreSQL; on SQLite they are deselected, loudly."""
    if connection.vendor == "postgresql":
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("postgres") else keep).append(item)
    if drop:
        _deselected_postgres.extend(item.nodeid for item in drop)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _deselected_postgres:
        terminalreporter.write_line(
            f"NOTE: {len(_deselected_postgres)} PostgreSQL tests were deselected on "
            f"{connection.vendor}; run them with DATABASE_URL=postgres://... (make test does).",
            yellow=True,
            bold=True,
        )


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    with fake_clock(T0) as fake:
        yield fake


@pytest.fixture
def rng() -> Iterator[object]:
    with fake_random(0.0) as fake:
        yield fake


@pytest.fixture
def host(db: None) -> Host:
    return HostFactory()
