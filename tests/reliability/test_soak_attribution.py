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


def _row(kind: str, message: str, *, at: float, os_pid: int, pid: int | None) -> dict:
    return {
        "at": at,
        "source": "cluster1:task:durable_agent.tasks.prompt_pass"
        if kind == "other:task"
        else "cluster1:log:durable_agent.tasks",
        "kind": kind,
        "pid": pid,
        "process_pids": [],
        "os_pid": os_pid,
        "request": None,
        "message": message,
    }


FAILURE = "AlarmError: commit maintenance checkpoint: Source facts could not commit"


@pytest.mark.parametrize(
    ("task_os_pid", "task_at", "explained"),
    [(7, 101.0, True), (8, 101.0, False), (7, 130.0, False)],
)
def test_a_failed_task_is_excused_by_its_worker_s_excused_log_line(
    task_os_pid: int, task_at: float, explained: bool
) -> None:
    # The task's record keeps only the text (PassError drops the cause); the worker's log line
    # of the same failure carries the terminated connection.
    from bench import soak

    rows = [
        _row(
            faults.TERMINATED, f"The pass of host 1 failed: {FAILURE}", at=100.0, os_pid=7, pid=55
        ),
        _row("other:task", f"{FAILURE} : Traceback ...", at=task_at, os_pid=task_os_pid, pid=None),
    ]
    chaos = soak.Chaos(terminated={55: 99.0})

    injected, unexplained, _ = soak.judge(rows, soak.Tally(), chaos, {})

    assert sum(injected.values()) == (2 if explained else 1)
    assert sum(unexplained.values()) == (0 if explained else 1)
