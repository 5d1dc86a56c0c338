"""Read-only queries shared by the commands, the admin and the API."""

from __future__ import annotations

from datetime import datetime

from durable_agent import clock
from durable_agent.models import Host


def due_hosts(*, now: datetime | None = None) -> list[Host]:
    """Hosts whose alarm slot is armed and due."""
    now = now or clock.now()
    return list(
        Host.objects.armed().filter(alarm__next_run__lte=now).select_related("alarm").order_by("pk")
    )


def hosts_for_pass(*, keys: list[str], due: bool, all: bool) -> list[Host]:
    """The hosts a maintenance command names. Unknown keys are an error before anything runs."""
    if not keys and not due and not all:
        raise ValueError("Name hosts with --host KEY, or use --due or --all")
    if all and (keys or due):
        raise ValueError("--all cannot be combined with --host or --due")
    chosen: dict[int, Host] = {}
    if keys:
        found = {h.key: h for h in Host.objects.filter(key__in=keys)}
        missing = [key for key in keys if key not in found]
        if missing:
            raise ValueError(f"Unknown host key(s): {', '.join(missing)}")
        chosen.update({found[key].pk: found[key] for key in keys})
    if due:
        chosen.update({h.pk: h for h in due_hosts()})
    if all:
        chosen.update({h.pk: h for h in Host.objects.order_by("pk")})
    return list(chosen.values())
