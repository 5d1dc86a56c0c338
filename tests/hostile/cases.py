"""Hostile agents and lanes, in one list: what each raises and what every surface must show.

The hostile-agent suite (tests/hostile/test_hostile.py in-process, and
tests/hostile/test_live_cluster.py through a live ``qcluster``) runs every case of
:data:`CASES`; add a case here and both run it. Each agent and lane appends ``run <name>`` to
the file named by ``HOSTILE_RUNS`` every time it runs: a count kept outside the database, so
no rollback can hide a run. The live cluster registers them through its app
(``tests.hostile.apps``, installed by ``tests.hostile.settings``); the test process registers
them with :func:`register`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from durable_agent import lanes
from durable_agent.agents import registry
from durable_agent.agents.context import ApprovalRequested

RUNS_ENV = "HOSTILE_RUNS"
#: What the storable-text rule puts for a NUL or a surrogate, and ends a cut text with.
REPLACEMENT = "\ufffd"
ELLIPSIS = "\u2026"


def ran(name: str) -> None:
    path = os.environ.get(RUNS_ENV)
    if not path:
        raise RuntimeError(f"{RUNS_ENV} is not set: hostile agents run only in their suite")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"run {name}\n".encode())  # one small O_APPEND write per run
    finally:
        os.close(fd)


def runs(path: str, name: str) -> int:
    """How many times the case ``name`` ran, by the file it appends to."""
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as lines:
        return sum(1 for line in lines if line.rstrip("\n") == f"run {name}")


class BadStr(Exception):
    """An exception whose ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


@dataclass(frozen=True)
class Case:
    """One hostile agent or lane.

    ``raises`` runs inside the agent (``raises(ctx)``) or the lane (``raises(None)``).
    An agent case settles in ``state`` with ``error`` (None: no error); a lane case fails
    every pass and turns its host failing, each pass recording ``error`` as the pass error.
    ``shown`` is a fragment every surface must show (the submission's or host's error).
    """

    name: str
    kind: str  # "agent" | "lane"
    raises: Callable[[Any], None]
    error: Any
    shown: str
    state: str = "settled"

    @property
    def agent(self) -> bool:
        return self.kind == "agent"


def _raise(exc: BaseException) -> Callable[[Any], None]:
    def raises(ctx: Any) -> None:
        raise exc

    return raises


def _taskgroup_approval(ctx: Any) -> None:
    """What asyncio.TaskGroup and anyio do with a task's suspension."""
    try:
        ctx.suspend_for_approval("ship it")
    except BaseException as exc:
        raise BaseExceptionGroup("unhandled errors in a TaskGroup", [exc]) from None


UNREADABLE = "(the message of this BadStr could not be read: RuntimeError)"
R = REPLACEMENT

CASES: list[Case] = [
    Case(
        "rt-nul",
        "agent",
        _raise(ValueError("upstream said: bad\x00byte")),
        {"type": "ValueError", "message": f"upstream said: bad{R}byte"},
        f"bad{R}byte",
    ),
    Case(
        "rt-surrogate",
        "agent",
        _raise(ValueError("half a pair: \ud800")),
        {"type": "ValueError", "message": f"half a pair: {R}"},
        f"half a pair: {R}",
    ),
    Case(
        "rt-badstr",
        "agent",
        lambda ctx: _raise(BadStr())(ctx),
        {"type": "BadStr", "message": UNREADABLE},
        UNREADABLE,
    ),
    Case("rt-taskgroup-approval", "agent", _taskgroup_approval, None, "ship it", state="suspended"),
    Case(
        "rt-exit",
        "agent",
        _raise(SystemExit("agent called sys.exit")),
        {"type": "SystemExit", "message": "agent called sys.exit"},
        "agent called sys.exit",
    ),
    Case(
        "rt-group-failure",
        "agent",
        lambda ctx: _raise(
            BaseExceptionGroup("two tasks", [ValueError("nul\x00"), GeneratorExit()])
        )(ctx),
        {
            "type": "BaseExceptionGroup",
            "message": f"two tasks (2 sub-exceptions): ValueError: nul{R}; GeneratorExit",
        },
        f"ValueError: nul{R}; GeneratorExit",
    ),
    Case(
        "rt-forged-approval",
        "agent",
        _raise(ApprovalRequested("forged\x00reason")),
        {"type": "ApprovalRequested", "message": f"forged{R}reason"},
        f"forged{R}reason",
    ),
    Case(
        "rt-huge",
        "agent",
        _raise(ValueError("x" * 100_000)),
        {"type": "ValueError", "message": "x" * 1999 + ELLIPSIS},
        "x" * 100,
    ),
    Case(
        "rt-nul-lane",
        "lane",
        _raise(RuntimeError("lane failed: bad\x00byte")),
        f"RuntimeError: lane failed: bad{R}byte",
        f"bad{R}byte",
    ),
    Case(
        "rt-html-lane",
        "lane",
        _raise(RuntimeError("<b>lane</b> failed")),
        "RuntimeError: <b>lane</b> failed",
        "<b>lane</b> failed",
    ),
    Case(
        "rt-badstr-lane",
        "lane",
        lambda ctx: _raise(BadStr())(ctx),
        f"BadStr: {UNREADABLE}",
        UNREADABLE,
    ),
    Case(
        "rt-exit-lane",
        "lane",
        _raise(SystemExit("lane called sys.exit")),
        "SystemExit: lane called sys.exit",
        "lane called sys.exit",
    ),
]


def _agent(case: Case) -> Callable[[Any, Any], None]:
    def agent(ctx: Any, payload: Any) -> None:
        ran(case.name)
        case.raises(ctx)

    return agent


def _lane(case: Case) -> Callable[[Any], None]:
    def lane(ctx: Any) -> None:
        ran(case.name)
        case.raises(None)

    return lane


def register() -> None:
    """Register every case's agent (version 1) and lane."""
    for case in CASES:
        if case.agent:
            registry.register(case.name, _agent(case), version="1")
        else:
            lanes.register(case.name, _lane(case))
