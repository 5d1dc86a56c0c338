"""Error accounting for the chaos soak: every error is recorded, classified and attributed.

Each soak process (clusters, the API server, producers, the soak itself) writes one JSON line
per error to ``$BENCH_ERROR_DIR/<os pid>.jsonl``: where it happened, its kind, and the
PostgreSQL backend pids of the connections the failing thread (and the pass's thread pool)
used. The soak then decides for each error whether a fault it injected explains it: only a
``connection_terminated`` error whose thread had a connection the soak terminated with
``pg_terminate_backend`` is explained. A SIGKILLed cluster raises nothing anywhere (its work
is recovered by leases and the sweep); a deadlock, a serialization failure or anything else
is never injected and fails the run.

Installed by ``bench.benchapp`` when ``BENCH_ERROR_DIR`` is set (the soak sets it, and
``bench.common.cluster`` for the benchmarks' clusters, which inject no faults: there every error
fails the run): a ``connection_created`` receiver that notes each connection's backend pid
(and writes it to ``<os pid>.conns``), a logging handler for every record at ERROR or above,
and django-q's ``post_execute_in_worker`` signal for failed tasks (recorded in the worker,
whose connection failed, not in the monitor that logs them again).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEADLOCK = "deadlock"
SERIALIZATION = "serialization_failure"
TERMINATED = "connection_terminated"

# What a client sees when its PostgreSQL backend was terminated (SQLSTATE 57P01) or its
# connection dropped under it.
_TERMINATED_TEXTS = (
    "terminating connection due to administrator command",
    "server closed the connection unexpectedly",
    "connection already closed",
    "the connection is closed",
    "the connection is lost",
    "consuming input failed",
    "no connection to the server",
)

# Log records that repeat an error recorded elsewhere: django-q's monitor logging a task
# failure (recorded by the worker), Django logging a 5xx response (the client counts it).
_DUPLICATE_LOGGERS = ("django.request", "django.server")
_DUPLICATE_PREFIXES = ("Failed '",)

_local = threading.local()
_opened: list[tuple[float, int, str]] = []  # (when, backend pid, thread name)
_opened_lock = threading.Lock()
_HELPERS = ("da-pass", "da-runtime")  # durable_agent/maintenance/passes/pool.py's threads


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__]


def classify_text(text: str) -> str:
    lowered = text.lower()
    if "deadlock detected" in lowered or "deadlockdetected" in lowered:
        return DEADLOCK
    if "could not serialize access" in lowered or "serializationfailure" in lowered:
        return SERIALIZATION
    if any(t in lowered for t in _TERMINATED_TEXTS) or "adminshutdown" in lowered:
        return TERMINATED
    return "other"


def classify(exc: BaseException) -> str:
    """The kind of ``exc``: its cause chain's SQLSTATE first, then its text."""
    kinds = set()
    for e in _chain(exc):
        state = getattr(e, "sqlstate", None)
        if state == "40P01":
            kinds.add(DEADLOCK)
        elif state == "40001":
            kinds.add(SERIALIZATION)
        elif state in ("57P01", "08006", "08003", "08000"):
            kinds.add(TERMINATED)
        else:
            kinds.add(classify_text(f"{type(e).__name__}: {e}"))
    for kind in (DEADLOCK, SERIALIZATION, TERMINATED):
        if kind in kinds:
            return kind
    return f"other:{type(exc).__name__}"


def backend_pid(alias: str = "default") -> int | None:
    """The backend pid of this thread's connection (the last one it opened), if any."""
    from django.db import connections

    return getattr(connections[alias], "soak_backend_pid", None)


def recent_pids() -> list[int]:
    """The backend pids of the connections this thread, or the pass's thread pool and
    runtime runner, opened in this process in the last 10 minutes (``CONN_MAX_AGE``).

    Not only the failing thread's current connection: a pass runs agent attempts on a
    thread pool ("da-pass") and bounded runtime calls (recovery, the abort-intent read) on a
    runner thread ("da-runtime"), whose connections outlive them; a failure there surfaces in
    the thread that waits for it, and a service may reconnect before it reports a failure.
    """
    horizon = time.time() - 600
    me = threading.current_thread().name
    with _opened_lock:
        _opened[:] = [row for row in _opened if row[0] >= horizon]
        return [pid for _, pid, name in _opened if name == me or name.startswith(_HELPERS)]


def set_request(request_id: str | None) -> None:
    """Tag this thread's errors with an HTTP request id (the API server)."""
    _local.request = request_id


def record(source: str, kind: str, message: str, *, pid: int | None = None, **extra: Any) -> None:
    """Append one error to this process's file (a no-op without ``BENCH_ERROR_DIR``)."""
    directory = os.environ.get("BENCH_ERROR_DIR")
    if not directory:
        return
    line = {
        "at": time.time(),
        "source": source,
        "kind": kind,
        "pid": pid,
        "process_pids": recent_pids(),
        "os_pid": os.getpid(),
        "request": getattr(_local, "request", None),
        "message": message[-1500:],
        **extra,
    }
    with open(Path(directory) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps(line, default=str) + "\n")


def record_exception(source: str, exc: BaseException, **extra: Any) -> str:
    kind = classify(exc)
    record(source, kind, f"{type(exc).__name__}: {exc}", pid=backend_pid(), **extra)
    return kind


def read(directory: str | Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def read_connections(directory: str | Path) -> dict[int, tuple[int, str]]:
    """Backend pid -> the OS pid and the source (``cluster0``...) of the process that opened
    it."""
    owners = {}
    for path in Path(directory).glob("*.conns"):
        for line in path.read_text(encoding="utf-8").splitlines():
            pid, source = line.split(" ", 1)
            owners[int(pid)] = (int(path.stem), source)
    return owners


_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class ErrorLogHandler(logging.Handler):
    """Records every log record at ERROR or above (bar the duplicates above)."""

    def __init__(self, source: str = "") -> None:
        super().__init__(level=logging.ERROR)
        self.source = source or os.environ.get("SOAK_SOURCE", "process")

    def emit(self, rec: logging.LogRecord) -> None:
        try:
            if rec.name.startswith(_DUPLICATE_LOGGERS):
                return
            message = rec.getMessage()
            if rec.name.startswith("django-q") and message.startswith(_DUPLICATE_PREFIXES):
                return
            # The record's extras carry the cause of some errors ("failure" of a recovery
            # fault: the diagnostic of what failed), as its exception carries others.
            extras = {k: v for k, v in rec.__dict__.items() if k not in _STANDARD}
            text = f"{message} {json.dumps(extras, default=str)}" if extras else message
            kind = classify_text(text)
            if rec.exc_info and rec.exc_info[1] is not None:
                kind = classify(rec.exc_info[1])
                text = f"{text}: {type(rec.exc_info[1]).__name__}: {rec.exc_info[1]}"
            elif kind == "other":
                kind = "other:log"
            record(f"{self.source}:log:{rec.name}", kind, text, pid=backend_pid())
        except Exception:  # a broken error log must not break the process; say so
            self.handleError(rec)


def _note_backend_pid(sender: Any, connection: Any, **kwargs: Any) -> None:
    try:
        pid = connection.connection.info.backend_pid
    except Exception:
        pid = None
    connection.soak_backend_pid = pid
    if pid:
        with _opened_lock:
            _opened.append((time.time(), pid, threading.current_thread().name))
        directory = os.environ.get("BENCH_ERROR_DIR")
        if directory:
            with open(Path(directory) / f"{os.getpid()}.conns", "a", encoding="utf-8") as out:
                out.write(f"{pid} {os.environ.get('SOAK_SOURCE', 'process')}\n")


def _task_done(sender: Any, task: dict[str, Any], **kwargs: Any) -> None:
    if not task.get("success", True):
        text = str(task.get("result"))
        kind = classify_text(text)
        record(
            f"{os.environ.get('SOAK_SOURCE', 'cluster')}:task:{task.get('func')}",
            kind if kind != "other" else "other:task",
            text,
            pid=backend_pid(),
        )


def install() -> None:
    """Wire the receivers and the handler into this process (bench.benchapp's ready())."""
    from django.db.backends.signals import connection_created

    connection_created.connect(_note_backend_pid, dispatch_uid="soak_backend_pid")
    try:
        from django_q.signals import post_execute_in_worker
    except ImportError:  # pragma: no cover - django-q2 is a dependency
        pass
    else:
        post_execute_in_worker.connect(_task_done, dispatch_uid="soak_task_done")
    import django_q.conf  # noqa: F401  (configures the django-q logger first)

    # The root logger, and the loggers that do not propagate to it (django-q's).
    for name in ("", "django-q"):
        target = logging.getLogger(name or None)
        if name and target.propagate:
            continue
        if not any(isinstance(h, ErrorLogHandler) for h in target.handlers):
            target.addHandler(ErrorLogHandler())
