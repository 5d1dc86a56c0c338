"""Three example agents: one asks for approval, one is retry-safe, one sometimes fails."""

from __future__ import annotations

import hashlib
from typing import Any

import durable_agent


class DemoFailure(RuntimeError):
    """An expected failure of the demo (a flaky tool, a webhook endpoint that is down).

    The example project logs it as one line, without a traceback (settings.LOGGING).
    """


@durable_agent.agent("publish-draft", version="1")
def publish_draft(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Drafts a post, then waits for an operator's approval before "publishing" it."""
    title = str(payload.get("title", "untitled"))
    ctx.suspend_for_approval(f"publish {title!r}")
    ctx.mark_side_effect()  # from here a crash leaves the outcome unknown
    return {"published": title, "url": f"https://example.invalid/{title.lower().replace(' ', '-')}"}


@durable_agent.agent("summarise", version="1", retry_safe=True)
def summarise(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """A pure function of its input: safe to run again after a crash."""
    text = str(payload.get("text", ""))
    words = text.split()
    return {"words": len(words), "summary": " ".join(words[:12])}


@durable_agent.agent("flaky-tool", version="1")
def flaky_tool(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Calls a pretend external tool that fails for about one input in three."""
    query = str(payload.get("query", ""))
    digest = hashlib.sha256(query.encode()).digest()
    if digest[0] % 3 == 0:
        raise DemoFailure(f"the tool timed out on {query!r}")
    return {"answer": digest.hex()[:16]}
