"""Two example host lanes that go wrong on purpose, so the demo has something to repair.

``digest`` never makes progress (it always asks to run again now): after 8 such passes the
lane parks, and an operator unparks it. ``webhooks`` always fails, as if its endpoint were
down: the pass fails and retries with backoff until an operator intervenes. Both raise or
stall deliberately; their failures log one line each (``DemoFailure``, see settings.LOGGING).
"""

from __future__ import annotations

from datetime import datetime

from durable_agent import lanes
from project.demo.agents import DemoFailure

DIGEST = "digest"
WEBHOOKS = "webhooks"


def digest(ctx: lanes.LaneContext) -> datetime:
    """A digest that never finishes: asks to run again at once, without progress."""
    return ctx.now()


def webhooks(ctx: lanes.LaneContext) -> None:
    raise DemoFailure("the webhook endpoint answered 503 (a demo failure)")


def register() -> None:
    lanes.register(DIGEST, digest)
    lanes.register(WEBHOOKS, webhooks)
