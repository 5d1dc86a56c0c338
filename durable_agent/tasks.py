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


#: Hosts the sweep reads per page (one query each) before it re-arms them.
SWEEP_PAGE_SIZE = 500


def sweep(*, page_size: int = SWEEP_PAGE_SIZE) -> dict[str, int]:
    """The backstop sweep: re-arm every host whose alarm was lost, apply registry changes.

    Finds hosts that owe work (a dirty generation or a lane deadline) with a missing or
    disarmed slot (a crash between django-q's fire and the pass's first commit, a database
    outage, a hand edit), and hosts with binding retries recorded under another registry key
    (a deploy), and runs ``ensure_alarm`` on each; then prunes one batch per table of the rows
    past their retention (``durable_agent.maintenance.retention``): old pass records, audit
    rows, delivered recovery events, long-expired mutation tickets and alarm task results.
    ``AlarmBroker`` runs it every minute; without that broker, schedule this task yourself.
    Returns ``rearmed`` and the number of rows pruned per table.

    Note [The sweep walks in pages]
        The hosts are read by ascending id, ``page_size`` at a time (keyset: each page starts
        after the last id of the previous one), and each page is re-armed before the next one
        is read: the memory the sweep holds is one page, whatever the number of hosts, and a
        host re-armed on one page no longer matches when a later page is read.
    """
    from durable_agent.maintenance import retention
    from durable_agent.maintenance.passes import ensure_alarm

    rearmed = 0
    after = 0
    while True:
        page = _sweep_page(after=after, limit=page_size)
        for host_id in page:
            try:
                ensure_alarm(host_id)
                rearmed += 1
            except Exception:
                logger.exception("Sweep could not re-arm host %s", host_id)
        if len(page) < page_size:
            break
        after = page[-1]
    pruned = retention.prune()
    if rearmed:
        logger.warning("Sweep re-armed %d hosts whose alarm was missing", rearmed)
    if any(pruned.values()):
        logger.info("Sweep pruned %s", ", ".join(f"{k}={v}" for k, v in pruned.items() if v))
    return {"rearmed": rearmed, **pruned}


def _sweep_page(*, after: int, limit: int) -> list[int]:
    """The ids, ascending and above ``after``, of at most ``limit`` hosts the sweep re-arms
    (Note [The sweep walks in pages])."""
    from django.db.models import Exists, F, OuterRef, Q

    from durable_agent.models import BindingRetry, DueLane, Host
    from durable_agent.runtime import get_runtime

    disarmed = Q(alarm__isnull=True) | Q(alarm__repeats=0)
    deadline = DueLane.objects.filter(host=OuterRef("pk"), due_at__isnull=False)
    owes = Q(maintenance__dirty__gt=F("maintenance__processed")) | Q(Exists(deadline))
    key = get_runtime().binding_registry_key()
    moved = BindingRetry.objects.filter(host=OuterRef("pk")).exclude(registry_key=key)
    return list(
        Host.objects.filter(pk__gt=after)
        .filter((disarmed & owes) | Q(Exists(moved)))
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )
