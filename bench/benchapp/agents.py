"""Agents the soak runs: short simulated work, one retry-safe and one plain."""

from __future__ import annotations

import random
import time
from typing import Any

import durable_agent


def _work(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(random.uniform(0, 0.02))  # simulated agent work (I/O)
    from bench.benchapp.models import Execution

    Execution.objects.create(submission_id=ctx.submission.pk, attempt=ctx.attempt)
    return {"n": payload.get("n"), "attempt": ctx.attempt}


durable_agent.agent("soak-safe", version="1", retry_safe=True)(_work)


@durable_agent.agent("soak-plain", version="1")
def soak_plain(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    return _work(ctx, payload)
