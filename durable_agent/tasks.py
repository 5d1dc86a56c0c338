"""django-q entry points."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from durable_agent.errors import HostNotFound

logger = logging.getLogger("durable_agent.tasks")


def fire_alarm(host_id: int, deadline: str | datetime | None = None, **_: Any) -> dict[str, Any]:
    """Run the maintenance pass of ``host_id`` for the alarm that fired at ``deadline``.

    At-least-once and idempotent: a stale, early or duplicate delivery changes nothing (the
    early-fire guard); a crashed delivery is redelivered by the broker and fenced the same way.
    """
    from durable_agent.maintenance.passes import run_pass

    when = datetime.fromisoformat(deadline) if isinstance(deadline, str) else deadline
    if when is None:  # a delivery without its deadline is guarded as if fired now
        from durable_agent import clock

        when = clock.now()
    try:  # the pass reads the host in its first transaction
        return run_pass(int(host_id), deadline=when, guard=True).as_dict()
    except HostNotFound:
        logger.warning("Alarm fired for host %s, which no longer exists", host_id)
        return {"host": None, "phase": "stale"}


def sweep() -> dict[str, int]:
    """The backstop sweep: re-arm every host whose alarm was lost, apply registry changes.

    Finds hosts that owe work (a dirty generation or a lane deadline) with a missing or
    disarmed slot (a crash between django-q's fire and the pass's first commit, a database
    outage, a hand edit), and hosts with binding retries recorded under another registry key
    (a deploy), and runs ``ensure_alarm`` on each; then prunes one batch per table of the rows
    past their retention (``durable_agent.maintenance.retention``): old pass records, audit
    rows, delivered recovery events, long-expired mutation tickets and alarm task results.
    ``AlarmBroker`` runs it every minute; without that broker, schedule this task yourself.
    Returns ``rearmed`` and the number of rows pruned per table.
    """
    from django.db.models import F, Q

    from durable_agent.maintenance import retention
    from durable_agent.maintenance.passes import ensure_alarm
    from durable_agent.models import BindingRetry, DueLane, MaintenanceState
    from durable_agent.runtime import get_runtime

    disarmed = Q(host__alarm__isnull=True) | Q(host__alarm__repeats=0)
    host_ids = set(
        MaintenanceState.objects.filter(disarmed, dirty__gt=F("processed")).values_list(
            "host_id", flat=True
        )
    )
    host_ids |= set(
        DueLane.objects.filter(disarmed, due_at__isnull=False).values_list("host_id", flat=True)
    )
    key = get_runtime().binding_registry_key()
    host_ids |= set(
        BindingRetry.objects.exclude(registry_key=key).values_list("host_id", flat=True)
    )
    rearmed = 0
    for host_id in sorted(host_ids):
        try:
            ensure_alarm(host_id)
            rearmed += 1
        except Exception:
            logger.exception("Sweep could not re-arm host %s", host_id)
    pruned = retention.prune()
    if rearmed:
        logger.warning("Sweep re-armed %d hosts whose alarm was missing", rearmed)
    if any(pruned.values()):
        logger.info("Sweep pruned %s", ", ".join(f"{k}={v}" for k, v in pruned.items() if v))
    return {"rearmed": rearmed, **pruned}
