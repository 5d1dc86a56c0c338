"""django-q entry points."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from durable_agent.models import Host

logger = logging.getLogger("durable_agent.tasks")


def fire_alarm(host_id: int, deadline: str | datetime | None = None, **_: Any) -> dict[str, Any]:
    """Run the maintenance pass of ``host_id`` for the alarm that fired at ``deadline``.

    At-least-once and idempotent: a stale, early or duplicate delivery changes nothing (the
    early-fire guard); a crashed delivery is redelivered by the broker and fenced the same way.
    """
    from durable_agent.maintenance.passes import run_pass

    when = datetime.fromisoformat(deadline) if isinstance(deadline, str) else deadline
    if not Host.objects.filter(pk=host_id).exists():
        logger.warning("Alarm fired for host %s, which no longer exists", host_id)
        return {"host": None, "phase": "stale"}
    return run_pass(host_id, deadline=when, guard=True).as_dict()
