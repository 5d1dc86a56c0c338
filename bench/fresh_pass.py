"""The pass that runs one fresh submission: its wall time and its statements.

    python -m bench.fresh_pass [--passes 200] [--counted 20] [--runs 3] [--statements]

Each pass runs in this process (``run_pass``, no broker, no worker), on a caught-up host of
its own (its first-use pass already ran) whose only work is one fresh submission of a
trivial agent (``bench-fresh``, which notes the time of its first line). Measured:
``run_pass`` start -> the agent's first line, and the whole pass. Then ``--counted`` more
passes with every Django connection of the process counted (every thread: the pass's pool
and runner too): SQL statements (``BEGIN`` and ``COMMIT`` are not statements Django
executes, so they are not among them), commits and connection health checks, before the
agent's first line and in the whole pass; ``--statements`` prints each run's first counted
pass's statements, in order. The counted passes are not timed. Goal: at most 5 ms and 12
statements per pass (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import threading
import time
from collections import Counter
from typing import Any

from bench.common import machine, reset, setup, summary, table

_first_line: list[float] = []
_counts: list[tuple[float, str]] = []  # (when, kind) of every counted round trip
_statements: list[tuple[float, str]] = []  # (when, SQL) of every counted statement
_counting = threading.Event()
_lock = threading.Lock()


def _note(kind: str, sql: str = "") -> None:
    if _counting.is_set():
        with _lock:
            now = time.perf_counter()
            _counts.append((now, kind))
            if sql:
                _statements.append((now, sql))


def _install_counters() -> None:
    """Count statements, commits and health checks of every Django connection."""
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.postgresql.base import DatabaseWrapper
    from django.db.backends.signals import connection_created

    def counted_sql(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        _note("sql", sql)
        return execute(sql, params, many, context)

    def add_wrapper(connection: Any, **_: Any) -> None:
        if counted_sql not in connection.execute_wrappers:
            connection.execute_wrappers.append(counted_sql)

    for cls, method, kind in [
        (BaseDatabaseWrapper, "commit", "commit"),
        (DatabaseWrapper, "is_usable", "health"),
    ]:
        original = getattr(cls, method)

        def make(original: Any = original, kind: str = kind) -> Any:
            @functools.wraps(original)
            def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
                _note(kind)
                return original(self, *args, **kwargs)

            return wrapped

        setattr(cls, method, make())
    connection_created.connect(add_wrapper, weak=False, dispatch_uid="bench_fresh_pass")
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        add_wrapper(connection)


def _register_agent() -> None:
    from durable_agent.agents import registry

    @registry.agent("bench-fresh", version="1")
    def fresh(ctx: Any, payload: Any) -> Any:
        _first_line.append(time.perf_counter())
        return None


def one_pass(key: str) -> tuple[float, float, float]:
    """Submit to a fresh host and run its pass: (start, agent's first line, end)."""
    import durable_agent
    from durable_agent.maintenance import run_pass
    from durable_agent.models import Host

    host = Host.objects.create(key=key)
    run_pass(host)  # its first-use pass: the host is caught up, as a host in use is
    durable_agent.submit(host=host, thread="t", agent="bench-fresh", payload={})
    _first_line.clear()
    started = time.perf_counter()
    report = run_pass(host)
    ended = time.perf_counter()
    if report.phase != "actionable" or report.settled != 1 or len(_first_line) != 1:
        raise RuntimeError(f"the pass did not run the submission once: {report}")
    return started, _first_line[0], ended


def run(passes: int, counted: int, run_no: int) -> dict[str, Any]:
    reset()
    for i in range(20):  # warm the connections, the pool and the plans
        one_pass(f"warm-{run_no}-{i}")
    to_agent, whole = [], []
    for i in range(passes):
        started, agent, ended = one_pass(f"timed-{run_no}-{i}")
        to_agent.append((agent - started) * 1000)
        whole.append((ended - started) * 1000)
    before: list[Counter[str]] = []
    total: list[Counter[str]] = []
    for i in range(counted):
        with _lock:
            _counts.clear()
            _statements.clear()
        _counting.set()
        try:
            started, agent, ended = one_pass(f"counted-{run_no}-{i}")
        finally:
            _counting.clear()
        with _lock:
            inside = [(t, k) for t, k in _counts if started <= t <= ended]
        before.append(Counter(k for t, k in inside if t <= agent))
        total.append(Counter(k for _, k in inside))
        if i == 0:
            with _lock:
                first = [
                    ("before" if t <= agent else "after", sql)
                    for t, sql in _statements
                    if started <= t <= ended
                ]
    return {
        "statements": first if counted else [],
        "to_agent": summary(to_agent),
        "whole": summary(whole),
        "before": before,
        "total": total,
    }


def _spread(counters: list[Counter[str]], kind: str) -> str:
    values = sorted(c[kind] for c in counters)
    return str(values[0]) if values[0] == values[-1] else f"{values[0]}-{values[-1]}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--counted", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--statements", action="store_true", help="print the first counted pass's statements"
    )
    args = parser.parse_args()
    setup()
    _register_agent()
    _install_counters()
    results = [run(args.passes, args.counted, n) for n in range(args.runs)]
    rows = [
        [
            n + 1,
            f"{r['to_agent']['p50']:.2f}",
            f"{r['to_agent']['p99']:.2f}",
            f"{r['whole']['p50']:.2f}",
            f"{r['whole']['p99']:.2f}",
            _spread(r["before"], "sql"),
            _spread(r["total"], "sql"),
            _spread(r["before"], "commit"),
            _spread(r["total"], "commit"),
            _spread(r["total"], "health"),
        ]
        for n, r in enumerate(results)
    ]
    median = [
        "median",
        f"{statistics.median(r['to_agent']['p50'] for r in results):.2f}",
        f"{statistics.median(r['to_agent']['p99'] for r in results):.2f}",
        f"{statistics.median(r['whole']['p50'] for r in results):.2f}",
        f"{statistics.median(r['whole']['p99'] for r in results):.2f}",
        "",
        "",
        "",
        "",
        "",
    ]
    table(
        f"The fresh-submission pass, {args.passes} timed and {args.counted} counted passes "
        f"per run ({machine()})",
        [
            "run",
            "start -> agent p50 ms",
            "p99 ms",
            "whole pass p50 ms",
            "p99 ms",
            "statements before the agent",
            "statements in all",
            "commits before",
            "commits in all",
            "health checks",
        ],
        [*rows, median],
    )
    if args.statements:
        for n, r in enumerate(results):
            print(f"\nStatements of run {n + 1}'s first counted pass:\n")
            for i, (when, sql) in enumerate(r["statements"], 1):
                print(f"{i:2d}. ({when} the agent) {' '.join(sql.split())[:160]}")


if __name__ == "__main__":
    main()
