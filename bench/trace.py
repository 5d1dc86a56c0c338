"""Bench-only tracing of a cluster: where the time of a pass goes, statement by statement.

Installed by ``bench.benchapp`` (its ``ready()``) in every process of a bench run when
``BENCH_TRACE_DIR`` is set (``python -m bench.immediate --profile`` sets it); without it nothing
here runs. It changes no behaviour: it wraps, in the running process only, the functions named
in ``SPANS`` (the alarm task, the pass's phases, the native step's steps, the attempt, the
lease claim, the settlement, every alarm transaction by its operation, the broker's firing and
its listener's wake-ups, the pass's thread-pool hand-offs), and records every SQL statement,
``COMMIT``, ``ROLLBACK``, connection health check and new connection of Django's connections.

Each process appends tab-separated lines to ``<dir>/trace-<pid>.tsv``::

    <start epoch s> <end epoch s> <pid> <thread name> <kind> <name>

``kind`` is ``span`` (a wrapped call), ``sql`` (the first 120 characters of one statement),
``commit``, ``rollback``, ``health`` (Django's ``CONN_HEALTH_CHECKS`` probe, a round trip),
``connect``, ``handoff`` (a pass's work queued on its thread pool: queued -> started), ``event``
(an instant: a notification received, a dequeue that returned tasks). ``bench.immediate``
reads the files back (``load``) and attributes each line to the pass whose ``fire_alarm`` or
``prompt_pass`` span in the same process encloses it.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from importlib import import_module
from pathlib import Path
from typing import Any

# (module, attribute): functions wrapped as spans, replaced in every module that imported them.
SPANS: list[tuple[str, str]] = [
    ("durable_agent.tasks", "fire_alarm"),
    ("durable_agent.tasks", "prompt_pass"),
    ("durable_agent.tasks", "hold_until"),
    ("durable_agent.maintenance.passes.run", "begin"),
    ("durable_agent.maintenance.passes.run", "run_waves_and_native"),
    ("durable_agent.maintenance.passes.native", "run_native"),
    ("durable_agent.maintenance.passes.finish", "finish"),
    ("durable_agent.maintenance.passes.finish", "record"),
    ("durable_agent.maintenance.passes.finish", "recorded"),
    ("durable_agent.maintenance.passes.ensure", "report_parked"),
    ("durable_agent.maintenance.passes.waves", "admit_waves"),
    ("durable_agent.maintenance.passes.waves", "publication_barrier"),
    ("durable_agent.maintenance.passes.waves", "after_native"),
    ("durable_agent.maintenance.passes.waves", "refill_waves"),
    ("durable_agent.maintenance.passes.native", "observe"),
    ("durable_agent.maintenance.passes.native", "select"),
    ("durable_agent.maintenance.passes.native", "dispatch"),
    ("durable_agent.maintenance.passes.native", "attempt"),
    ("durable_agent.maintenance.passes.native", "checkpoint"),
    ("durable_agent.maintenance.passes.recovery", "recover_thread"),
    ("durable_agent.maintenance.passes.pool", "bounded_call"),
    ("durable_agent.agents.attempts", "process_thread_head"),
    ("durable_agent.agents.attempts", "head_of"),
    ("durable_agent.agents.attempts", "_call_agent"),
    ("durable_agent.agents.attempts", "_settle"),
    ("durable_agent.agents.attempts", "_suspend"),
    ("durable_agent.agents.leases", "claim"),
    ("durable_agent.agents.services", "submit"),
    ("durable_agent.agents.services", "approve"),
    ("durable_agent.maintenance.mutations.gate", "schedule"),
    ("durable_agent.maintenance.mutations.gate", "_flush"),
    ("durable_agent.maintenance.mutations.commit_function", "commit"),
]
# Context managers: the time to enter and the time to leave are two spans.
CONTEXTS: list[tuple[str, str]] = [
    ("durable_agent.maintenance.passes.state", "heartbeat"),
]
# Methods: (module, class, method).
METHODS: list[tuple[str, str, str]] = [
    ("durable_agent.broker", "AlarmFiring", "fire_alarm_batch"),
    ("durable_agent.broker", "AlarmFiring", "fire_ahead"),
    ("durable_agent.broker", "AlarmFiring", "probe"),
    ("durable_agent.broker", "AlarmBroker", "ready_tasks"),
]

_lock = threading.Lock()
_out: Any = None
_out_pid = 0


def _write(start: float, end: float, kind: str, name: str) -> None:
    global _out, _out_pid
    line = (
        f"{start:.6f}\t{end:.6f}\t{os.getpid()}\t{threading.current_thread().name}\t{kind}\t"
        + name.replace("\t", " ").replace("\n", " ")[:120]
        + "\n"
    )
    with _lock:
        if _out is None or _out_pid != os.getpid():  # a forked child opens its own file
            directory = os.environ["BENCH_TRACE_DIR"]
            _out = open(os.path.join(directory, f"trace-{os.getpid()}.tsv"), "a", buffering=1)  # noqa: SIM115
            _out_pid = os.getpid()
        _out.write(line)


def _span(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        label = name
        if name.endswith("run_alarm_transaction") and len(args) > 1:
            label = f"txn {args[1]}"
        elif name == "tasks.fire_alarm":  # the host and the deadline: bench.immediate matches them
            deadline = kwargs.get("deadline")
            when = datetime.fromisoformat(deadline).timestamp() if deadline else 0.0
            label = f"{name} {args[0]} {when:.6f}"
        elif name == "tasks.prompt_pass":  # the host: bench.immediate matches it
            label = f"{name} {args[0]}"
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            _write(start, time.time(), "span", label)

    wrapper.__bench_traced__ = fn  # type: ignore[attr-defined]
    return wrapper


def _context(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    @contextmanager
    def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
        start = time.time()
        with fn(*args, **kwargs) as value:
            _write(start, time.time(), "span", f"{name} enter")
            try:
                yield value
            finally:
                leaving = time.time()
        _write(leaving, time.time(), "span", f"{name} exit")

    return wrapper


def _replace_everywhere(original: Any, replacement: Any) -> None:
    """Point every loaded durable_agent module's name for ``original`` at ``replacement``."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("durable_agent"):
            continue
        for attribute, value in list(vars(module).items()):
            if value is original:
                setattr(module, attribute, replacement)


def _trace_sql(connection: Any, **_: Any) -> None:
    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        start = time.time()
        try:
            return execute(sql, params, many, context)
        finally:
            _write(start, time.time(), "sql", " ".join(str(sql).split()))

    if not any(getattr(w, "__bench_sql__", False) for w in connection.execute_wrappers):
        wrapper.__bench_sql__ = True  # type: ignore[attr-defined]
        connection.execute_wrappers.append(wrapper)


def _wrap_backend() -> None:
    """COMMIT, ROLLBACK, health checks and connects of every Django connection."""
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.postgresql.base import DatabaseWrapper
    from django.db.backends.signals import connection_created

    for cls, method, kind in [
        (BaseDatabaseWrapper, "commit", "commit"),
        (BaseDatabaseWrapper, "rollback", "rollback"),
        (DatabaseWrapper, "is_usable", "health"),
        (BaseDatabaseWrapper, "connect", "connect"),
    ]:
        original = getattr(cls, method)

        def make(original: Any = original, kind: str = kind) -> Any:
            @functools.wraps(original)
            def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
                start = time.time()
                try:
                    return original(self, *args, **kwargs)
                finally:
                    _write(start, time.time(), kind, kind)

            return wrapped

        setattr(cls, method, make())
    connection_created.connect(_trace_sql, dispatch_uid="bench_trace_sql")


def _wrap_pool() -> None:
    """Each piece of work a pass queues on its thread pool: queued -> started on a pool thread."""
    from durable_agent.maintenance.passes import pool

    original_submit = pool.Executor.submit

    def submit(self: Any, fn: Callable[[], Any]) -> Any:
        queued = time.time()

        def timed() -> Any:
            _write(queued, time.time(), "handoff", "pass pool")
            return fn()

        return original_submit(self, timed)

    pool.Executor.submit = submit  # type: ignore[method-assign]


def _wrap_listener() -> None:
    from durable_agent.alarm_listener import AlarmListener

    original = AlarmListener.wait

    def wait(self: Any, timeout: float) -> Any:
        wakes = original(self, timeout)
        now = time.time()
        for wake in wakes:
            if wake.host is not None:  # a prompt hint (Note [Prompt start])
                _write(now, now, "event", f"hint {wake.host}")
                continue
            due = "reconnect" if wake.due is None else f"{wake.due.timestamp():.6f}"
            _write(now, now, "event", f"notify {due}")
        return wakes

    AlarmListener.wait = wait  # type: ignore[method-assign]

    from durable_agent.broker import AlarmFiring

    dequeue = AlarmFiring.dequeue

    def traced_dequeue(self: Any) -> Any:
        tasks = dequeue(self)
        if tasks:
            now = time.time()
            _write(now, now, "event", f"dequeue {len(tasks)}")
        return tasks

    AlarmFiring.dequeue = traced_dequeue  # type: ignore[method-assign]


def install() -> None:
    """Wrap everything listed above in this process (idempotent per process)."""
    if getattr(install, "done", False):
        return
    install.done = True  # type: ignore[attr-defined]
    import durable_agent.agents.runtime
    import durable_agent.broker
    import durable_agent.maintenance
    import durable_agent.tasks  # noqa: F401
    from durable_agent.maintenance.store import transactions

    for module_name, attribute in SPANS:
        module = import_module(module_name)
        original = getattr(module, attribute)
        _replace_everywhere(
            original, _span(f"{module_name.rsplit('.', 1)[-1]}.{attribute}", original)
        )
    for module_name, attribute in CONTEXTS:
        module = import_module(module_name)
        original = getattr(module, attribute)
        setattr(module, attribute, _context(attribute, original))
    original = transactions.run_alarm_transaction
    _replace_everywhere(original, _span("run_alarm_transaction", original))
    for module_name, class_name, method in METHODS:
        cls = getattr(import_module(module_name), class_name)
        original = cls.__dict__.get(method) or getattr(cls, method)
        setattr(cls, method, _span(f"{class_name}.{method}", original))
    _wrap_backend()
    _wrap_pool()
    _wrap_listener()


# -- reading the files back ----------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    start: float
    end: float
    pid: int
    thread: str
    kind: str
    name: str

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1000


def load(directory: str) -> list[Line]:
    lines: list[Line] = []
    for path in Path(directory).glob("trace-*.tsv"):
        for text in path.read_text().splitlines():
            parts = text.split("\t")
            if len(parts) != 6:
                continue  # a line cut by a killed process
            start, end, pid, thread, kind, name = parts
            lines.append(Line(float(start), float(end), int(pid), thread, kind, name))
    lines.sort(key=lambda line: line.start)
    return lines
