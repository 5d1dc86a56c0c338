"""The chaos soak's error attribution (bench/faults.py): an error is excused only by a
connection the soak terminated, so every thread whose connection a pass waits on must be
attributed to the thread that reports the failure."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from bench import faults


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, int, str]]:
    rows: list[tuple[float, int, str]] = []
    monkeypatch.setattr(faults, "_opened", rows)
    monkeypatch.delenv("BENCH_ERROR_DIR", raising=False)
    return rows


def _open_on(prefix: str, backend: int) -> None:
    """Open a (fake) connection on a thread of the pool named ``prefix``."""
    fake = SimpleNamespace(connection=SimpleNamespace(info=SimpleNamespace(backend_pid=backend)))
    with ThreadPoolExecutor(1, prefix) as pool:
        pool.submit(faults._note_backend_pid, None, fake).result()


def test_a_runtime_runner_connection_is_the_waiting_thread_s(opened: list) -> None:
    # A bounded runtime call (the abort-intent read, recovery) runs on "da-runtime"; when the
    # soak terminates its connection, the pass's thread logs the recovery fault.
    _open_on("da-runtime", 101)
    _open_on("da-pass", 102)
    _open_on("elsewhere", 103)
    assert threading.current_thread().name not in ("da-runtime_0", "da-pass_0")
    assert sorted(faults.recent_pids()) == [101, 102]


def test_an_old_connection_is_not_attributed(opened: list) -> None:
    _open_on("da-runtime", 201)
    opened[:] = [(when - 601, pid, name) for when, pid, name in opened]
    assert faults.recent_pids() == []
