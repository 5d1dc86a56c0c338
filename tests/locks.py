"""Every row lock the suite takes, checked as it is taken (Note [Lock one table]).

``install()`` wraps Django's cursor so that each statement with a locking clause (``FOR
UPDATE``, ``FOR NO KEY UPDATE``, ``FOR SHARE``, ``FOR KEY SHARE``) is parsed: the tables it
locks are those named after ``OF``, or, without ``OF``, every table of its top-level ``FROM``
clause. A lock breaks the discipline when

- it locks more than one table, or a table it does not name with ``OF`` while joining others
  (``FOR UPDATE`` without ``OF`` over a join), or
- inside one transaction it locks a table ranked before one it already locked
  (``LOCK_ORDER``: Note [Ledger lock order], then Note [Lock order]), or a table with no rank.
  A transaction that carries several hosts (one ``gate.transaction`` frame writing to two hosts)
  flushes them one at a time in id order: a state row of a host with a greater id starts the
  order afresh; one with a smaller id is a violation.

A call of a server-side function that locks rows (``FUNCTION_LOCKS``) counts as the locking
statements it runs, in the order it runs them.

A transaction is a connection's outermost atomic block that the test itself (not the test
framework's wrapping transaction) opened. Statements run by the capture's own connection in any
thread are checked; statements of other processes (a live ``qcluster``) are not.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.backends.utils import CursorWrapper
from django.test import testcases

# Tables in the order a transaction may lock them.
LOCK_ORDER = (
    "durable_agent_thread",
    "durable_agent_submission",
    "durable_agent_maintenancestate",
    "durable_agent_duelane",
    "durable_agent_workcursor",
    "django_q_schedule",
)

STATE_TABLE = "durable_agent_maintenancestate"

# Server-side functions and the tables they lock with FOR UPDATE, in order (Note [The commit
# function] in durable_agent/migrations/sql/0015_commit_intent.sql). Their first argument is the
# host. Like the Python path they then write the schedule row with a plain UPDATE, which the
# capture does not count; tests/maintenance/mutations/test_commit_function.py checks the whole
# order, schedule row last, against a second connection.
FUNCTION_LOCKS = {
    "durable_agent_commit_intent": (STATE_TABLE, "durable_agent_duelane"),
    # Note [Lock and read in one call] (durable_agent/maintenance/store/rows.py)
    "durable_agent_lock_and_read": (STATE_TABLE, "durable_agent_duelane"),
}

_LOCKING = re.compile(r"\bFOR\s+(?:NO\s+KEY\s+UPDATE|UPDATE|KEY\s+SHARE|SHARE)\b", re.IGNORECASE)
_OF = re.compile(r"\bOF\s+(.+?)(?:\s+(?:NOWAIT|SKIP\s+LOCKED)\b|$)", re.IGNORECASE | re.DOTALL)
_TABLE = re.compile(r'"?([A-Za-z_][A-Za-z0-9_]*)"?')


@dataclass
class Violation:
    reason: str
    sql: str

    def __str__(self) -> str:
        return f"{self.reason}\n    {self.sql}"


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    # the test framework's own atomic blocks (weakly: a freed block's id may be reused)
    framework_atomics: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    # connection id -> tables locked so far in its current transaction, since its last host
    held: dict[int, list[str]] = field(default_factory=dict)
    # connection id -> the host id of the last state row its current transaction locked
    host: dict[int, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    seen: list[tuple[str, ...]] = field(default_factory=list)


_state = _State()


def _top_level(sql: str) -> str:
    """``sql`` with every parenthesised part (subqueries, ON clauses, call arguments) removed."""
    out, depth = [], 0
    for char in sql:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif depth == 0:
            out.append(char)
    return "".join(out)


def locked_tables(sql: str) -> tuple[str, ...] | None:
    """The tables a statement locks: what ``OF`` names, or without ``OF`` every table of its
    top-level ``FROM`` clause (joins included); None for a statement that locks nothing."""
    top = _top_level(sql)
    clause = _LOCKING.search(top)
    if clause is None:
        return None
    body, tail = top[: clause.start()], top[clause.end() :]
    start = re.search(r"\bFROM\b", body, re.IGNORECASE)
    joined: list[str] = []
    if start is not None:
        source = body[start.end() :]
        source = re.split(
            r"\b(?:WHERE|GROUP\s+BY|ORDER\s+BY|LIMIT|OFFSET|HAVING)\b",
            source,
            maxsplit=1,
            flags=re.IGNORECASE,
        )[0]
        for part in re.split(r",|\bJOIN\b", source, flags=re.IGNORECASE):
            name = _TABLE.search(part.strip())
            if name is not None:
                joined.append(name.group(1))
    of = _OF.search(tail.strip())
    if of is None:
        return tuple(joined)
    return tuple(m.group(1) for m in _TABLE.finditer(of.group(1)))


def check(sql: str, held: list[str]) -> list[Violation]:
    """The violations of one statement, given the tables its transaction already locked."""
    locked = locked_tables(sql)
    if locked is None:
        return []
    found = []
    if len(locked) != 1:
        found.append(Violation(f"locks {len(locked)} tables {locked}; name one with OF", sql))
    for table in locked:
        if table not in LOCK_ORDER:
            found.append(Violation(f"locks {table!r}, which has no place in LOCK_ORDER", sql))
            continue
        later = [
            t for t in held if t in LOCK_ORDER and LOCK_ORDER.index(t) > LOCK_ORDER.index(table)
        ]
        if later:
            found.append(Violation(f"locks {table!r} after {later[-1]!r} in one transaction", sql))
    return found


def _transaction_key(db: Any) -> int | None:
    """The connection's id while a test-opened transaction runs on it, else None."""
    blocks = getattr(db, "atomic_blocks", [])
    base = 0
    while base < len(blocks) and blocks[base] in _state.framework_atomics:
        base += 1
    return id(db) if len(blocks) > base else None


def _state_host(sql: str, params: Any) -> int | None:
    """The host id of a state-row lock (``rows.lock_state_row``), else None."""
    if locked_tables(sql) != (STATE_TABLE,) or not isinstance(params, list | tuple) or not params:
        return None
    return params[0] if isinstance(params[0], int) else None


def _function_locks(sql: str, params: Any) -> list[tuple[str, int | None]] | None:
    """A call of a function of ``FUNCTION_LOCKS`` as the locking statements it runs."""
    for name, tables in FUNCTION_LOCKS.items():
        if re.search(rf"\b{name}\s*\(", sql):
            host = params[0] if isinstance(params, list | tuple) and params else None
            # one call for several hosts (Note [A group's reads in one call]): each in turn
            hosts = host if isinstance(host, list) else [host]
            steps = []
            for one in hosts:
                steps.append((f"SELECT * FROM {tables[0]} FOR UPDATE", one))
                steps += [(f"SELECT * FROM {table} FOR UPDATE", None) for table in tables[1:]]
            return steps
    return None


def _record(db: Any, sql: Any, params: Any) -> None:
    if not isinstance(sql, str):
        return
    steps = _function_locks(sql, params)
    if steps is None:
        if "FOR" not in sql.upper():
            return
        steps = [(sql, _state_host(sql, params))]
    key = _transaction_key(db)
    with _state.lock:
        held = _state.held.setdefault(key, []) if key is not None else []
        for statement, host in steps:
            if key is not None and host is not None:
                last = _state.host.get(key)
                if last == host:
                    # The same host's state row again: a row the transaction holds, or, after
                    # a call that found no state row and so locked nothing (Note [Lock and
                    # read in one call]), its first lock once created. Neither can wait
                    # behind a later table.
                    continue
                if last is not None and host < last:
                    _state.violations.append(
                        Violation(f"locks host {host}'s state row after host {last}'s", sql)
                    )
                elif last is not None and host > last:
                    held.clear()  # the next host of a frame that carries several, in id order
                _state.host[key] = host
            _state.violations.extend(check(statement, held))
            locked = locked_tables(statement)
            if locked is not None:
                _state.seen.append(locked)
                held.extend(locked)


def install() -> None:
    """Wrap cursors, atomic blocks and the test framework's transactions (once per process)."""
    if getattr(CursorWrapper, "_lock_capture", False):
        return
    execute, executemany = CursorWrapper.execute, CursorWrapper.executemany

    def checked_execute(self: CursorWrapper, sql: Any, params: Any = None) -> Any:
        _record(self.db, sql, params)
        return execute(self, sql, params)

    def checked_executemany(self: CursorWrapper, sql: Any, param_list: Any) -> Any:
        _record(self.db, sql, None)
        return executemany(self, sql, param_list)

    atomic_exit = transaction.Atomic.__exit__

    def exit_atomic(self: transaction.Atomic, *exc: Any) -> Any:
        try:
            return atomic_exit(self, *exc)
        finally:
            db = transaction.get_connection(self.using)
            if _transaction_key(db) is None:
                with _state.lock:
                    _state.held.pop(id(db), None)
                    _state.host.pop(id(db), None)

    enter_atomics = testcases.TestCase._enter_atomics.__func__  # type: ignore[attr-defined]

    def framework_atomics(cls: type[testcases.TestCase]) -> Any:
        atomics = enter_atomics(cls)
        _state.framework_atomics.update(atomics.values())
        return atomics

    CursorWrapper.execute = checked_execute  # type: ignore[method-assign]
    CursorWrapper.executemany = checked_executemany  # type: ignore[method-assign]
    transaction.Atomic.__exit__ = exit_atomic  # type: ignore[method-assign]
    testcases.TestCase._enter_atomics = classmethod(framework_atomics)  # type: ignore[assignment,method-assign]
    CursorWrapper._lock_capture = True  # type: ignore[attr-defined]


def take_violations() -> list[Violation]:
    """The violations recorded since the last call, and forget them."""
    with _state.lock:
        found, _state.violations[:] = list(_state.violations), []
        return found


@contextmanager
def capture() -> Iterator[list[tuple[str, ...]]]:
    """The tables each locking statement inside the block locked, in order."""
    with _state.lock:
        start = len(_state.seen)
    seen: list[tuple[str, ...]] = []
    try:
        yield seen
    finally:
        with _state.lock:
            seen.extend(_state.seen[start:])
