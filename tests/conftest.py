from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from durable_agent.models import Host
from durable_agent.testing import (
    FakeClock,
    ScriptedRuntime,
    fake_clock,
    fake_random,
    installed_runtime,
)
from tests import locks
from tests.factories import T0, HostFactory

_deselected_postgres: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Tests close every connection after use (``CONN_MAX_AGE=0``), whatever the project sets:
    a connection kept by a pass's pool thread would block dropping the test database.
    tests/maintenance/passes/test_pool.py turns persistence back on where it tests it."""
    from django.conf import settings

    for database in settings.DATABASES.values():
        database["CONN_MAX_AGE"] = 0
    locks.install()


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


@pytest.fixture(autouse=True)
def _row_locks_name_their_table() -> Iterator[None]:
    """Every row lock the test takes, in any thread, follows Note [Lock one table]."""
    locks.take_violations()
    yield
    found = locks.take_violations()
    if found:
        pytest.fail(
            "Row locks outside the discipline of Note [Lock one table] "
            "(durable_agent/maintenance/store/transactions.py):\n" + "\n".join(map(str, found)),
            pytrace=False,
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


@pytest.fixture(autouse=True)
def _pass_runs_inline(request: pytest.FixtureRequest, settings: object) -> None:
    """Passes run attempts and waves inline, so they see the test's transaction.

    Tests marked ``threads`` keep the thread pool (they need ``transaction=True``).
    """
    if request.node.get_closest_marker("threads") is None:
        settings.DURABLE_AGENT = {**(settings.DURABLE_AGENT or {}), "PASS_WORKERS": 1}  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _restore_lane_registry() -> Iterator[None]:
    from durable_agent.maintenance import lane_registry

    saved = lane_registry.snapshot()
    yield
    lane_registry.restore(saved)


@pytest.fixture
def runtime() -> Iterator[ScriptedRuntime]:
    with installed_runtime(ScriptedRuntime()) as scripted:
        yield scripted
