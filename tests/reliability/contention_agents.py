"""The agent the contention test (tests/reliability/test_contention.py) runs in a live cluster.

The cluster imports it through ``tests.reliability.contention_settings``; the test process
registers it with :func:`register` while the test runs (the API's ``submit`` checks that the
agent exists). Every run appends ``run <submission> <attempt>`` to the file named by
``CONTENTION_EFFECTS``, and every run that gets past its approval appends ``effect ...``:
the agent's own side-effect counter, kept outside the database so no rollback can hide a run.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.apps import AppConfig

from durable_agent.agents import registry

AGENT = "contention-work"
EFFECTS_ENV = "CONTENTION_EFFECTS"


def _record(kind: str, ctx: Any) -> None:
    path = os.environ.get(EFFECTS_ENV)
    if not path:
        raise RuntimeError(f"{EFFECTS_ENV} is not set: this agent runs only in the contention test")
    line = f"{kind} {ctx.submission.pk} {ctx.attempt}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one small O_APPEND write: whole lines, even from many processes
    finally:
        os.close(fd)


def work(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """A short piece of work; asks for approval when the payload says so."""
    _record("run", ctx)
    time.sleep(int(payload.get("work_ms", 0)) / 1000)  # simulated I/O: aborts can land mid-run
    if payload.get("approval"):
        ctx.suspend_for_approval(f"release {payload['n']}")
    _record("effect", ctx)
    return {"n": payload["n"], "attempt": ctx.attempt}


def register() -> None:
    registry.register(AGENT, work, version="1")


class ContentionAgentsConfig(AppConfig):
    name = "tests.reliability.contention_agents"
    label = "contention_agents"

    def ready(self) -> None:
        register()
