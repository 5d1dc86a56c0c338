"""Agents the soak runs: short simulated work, one retry-safe, one plain, one that asks for
approval before it works, and one whose first attempt fails and is retried by its policy."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import durable_agent


def _work(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(random.uniform(0, 0.02))  # simulated agent work (I/O)
    from bench.benchapp.models import Execution
    from bench.faults import backend_pid

    # Where it ran: a re-run is explained only by a crash of this process or this connection.
    Execution.objects.create(
        submission_id=ctx.submission.pk,
        attempt=ctx.attempt,
        os_pid=os.getpid(),
        db_pid=backend_pid(),
    )
    return {"n": payload.get("n"), "attempt": ctx.attempt}


durable_agent.agent("soak-safe", version="1", retry_safe=True)(_work)


@durable_agent.agent("soak-plain", version="1")
def soak_plain(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    return _work(ctx, payload)


@durable_agent.agent("soak-approval", version="1")
def soak_approval(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    ctx.suspend_for_approval("soak operator")  # the soak's operators approve or abort it
    return _work(ctx, payload)


# -- bench/immediate.py ----------------------------------------------------------------------
# Each agent records the moment its first line runs (and, for the approval agent, the moment it
# resumes past its approval) in ``BENCH_HANDLER_DIR``, one file per process and thread:
# ``<submission id> <what> <epoch seconds>``.


def _stamp(ctx: Any, what: str) -> None:
    started = time.time()
    directory = os.environ.get("BENCH_HANDLER_DIR")
    if directory:
        import threading

        name = os.path.join(directory, f"agent-{os.getpid()}-{threading.get_ident()}.log")
        with open(name, "a") as out:
            out.write(f"{ctx.submission.pk} {what} {started:.6f}\n")


@durable_agent.agent("bench-immediate", version="1")
def bench_immediate(ctx: Any, payload: dict[str, Any]) -> None:
    _stamp(ctx, "start")


@durable_agent.agent("bench-approval", version="1")
def bench_approval(ctx: Any, payload: dict[str, Any]) -> None:
    _stamp(ctx, "start")
    ctx.suspend_for_approval("bench")
    _stamp(ctx, "resumed")


class FirstTryFails(Exception):
    """The soak-retry agent's first attempt, by design."""


@durable_agent.agent(
    "soak-retry",
    version="1",
    retry=durable_agent.RetryPolicy(on=(FirstTryFails,), max_attempts=3, backoff=0.2, cap=0.5),
)
def soak_retry(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    result = _work(ctx, payload)  # recorded: the soak explains this run by the retry
    if ctx.attempt == 1:
        raise FirstTryFails("the first attempt fails; the policy runs it again")
    return result
