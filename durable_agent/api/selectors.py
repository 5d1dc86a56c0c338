"""Read-only queries behind the API's GET endpoints (a constant number of queries each)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from durable_agent import clock
from durable_agent.errors import HostNotFound
from durable_agent.maintenance import selectors
from durable_agent.maintenance.operators.audit import HostAudit, audit_host
from durable_agent.maintenance.store.selectors import Verdict, is_overdue, verdict
from durable_agent.models import (
    AlarmAudit,
    BindingRetry,
    DueLane,
    Host,
    MaintenanceState,
    PassRecord,
    RecoveryFault,
)
from durable_agent.runtime import get_runtime

RECENT_PASSES = 10


@dataclass(frozen=True)
class HostFilters:
    """Each filter keeps hosts that match it (True) or that do not (False); None ignores it."""

    overdue: bool | None = None
    parked: bool | None = None
    faulted: bool | None = None
    dirty: bool | None = None
    failing: bool | None = None


@dataclass(frozen=True)
class Page:
    count: int
    limit: int
    offset: int
    items: list[Any]


def _annotated_hosts() -> QuerySet[Host]:
    """Hosts with the shared read model's annotations (see ``maintenance/store/selectors.py``)."""
    return selectors.annotate_hosts(Host.objects.select_related("alarm"))


def _choose(
    queryset: QuerySet[Host], condition: Callable[[], Q], wanted: bool | None
) -> QuerySet[Host]:
    """Filter by ``condition()`` (built only when asked for: one may read ahead) when
    ``wanted`` is set."""
    if wanted is None:
        return queryset
    return queryset.filter(condition()) if wanted else queryset.exclude(condition())


@dataclass(frozen=True)
class HostPage:
    items: list[Host]
    more: bool


def host_page(*, filters: HostFilters, limit: int, after: int | None = None) -> HostPage:
    """Up to ``limit`` hosts by ascending id above ``after``, with their generations and
    counts, filtered (Note [Host pages] in ``durable_agent/api/hosts.py``); ``more`` tells
    whether a later host matches too."""
    now = clock.now()
    hosts = _annotated_hosts()
    if after is not None:
        hosts = hosts.filter(pk__gt=after)
    hosts = _choose(hosts, lambda: selectors.overdue_hosts(now), filters.overdue)
    hosts = _choose(hosts, selectors.parked_hosts, filters.parked)
    hosts = _choose(hosts, lambda: Q(selectors.faulted()), filters.faulted)
    hosts = _choose(hosts, selectors.dirty_hosts, filters.dirty)
    hosts = _choose(hosts, selectors.failing_hosts, filters.failing)
    page = list(hosts.order_by("pk")[: limit + 1])
    return HostPage(items=page[:limit], more=len(page) > limit)


def get_host(key: str) -> Host:
    """The host called ``key`` (with its alarm row), else :class:`HostNotFound`."""
    host = Host.objects.select_related("alarm").filter(key=key).first()
    if host is None:
        raise HostNotFound(f"No host with key {key!r}", host=key)
    return host


@dataclass(frozen=True)
class HostDetail:
    host: Host
    slot: datetime | None
    overdue: bool
    verdict: Verdict
    state: MaintenanceState | None
    lanes: list[DueLane]
    binding_retries: list[BindingRetry]
    faults: list[RecoveryFault]
    recent_passes: list[PassRecord]
    invariant: HostAudit


def host_detail(key: str) -> HostDetail:
    """Everything the host page shows: state, slot, lanes, retries, faults, recent passes."""
    now = clock.now()
    host = _annotated_hosts().filter(key=key).first()
    if host is None:
        raise HostNotFound(f"No host with key {key!r}", host=key)
    state = MaintenanceState.objects.filter(host=host).first()
    lanes = list(DueLane.objects.filter(host=host).order_by("lane"))
    invariant = audit_host(
        host,
        now=now,
        state=state,
        lanes=lanes,
        registry_key=get_runtime().binding_registry_key(),
        failed_passes=host.failed_passes,  # type: ignore[attr-defined]
        last_error=host.last_error or "",  # type: ignore[attr-defined]
    )
    slot = host.slot_at  # type: ignore[attr-defined]
    return HostDetail(
        host=host,
        slot=slot,
        overdue=is_overdue(slot, now),
        verdict=verdict(host, now),
        state=state,
        lanes=lanes,
        binding_retries=list(BindingRetry.objects.filter(host=host).order_by("pk")),
        faults=list(RecoveryFault.objects.filter(host=host).order_by("thread")),
        recent_passes=list(PassRecord.objects.filter(host=host)[:RECENT_PASSES]),
        invariant=invariant,
    )


def host_lanes(key: str) -> list[DueLane]:
    """The host's due-queue rows by lane id (dormant rows included)."""
    return list(DueLane.objects.filter(host=get_host(key)).order_by("lane"))


def host_audit_page(key: str, *, limit: int, offset: int) -> Page:
    """The host's alarm audit trail, newest first."""
    rows = AlarmAudit.objects.filter(host=get_host(key)).order_by("-at", "-id")
    return Page(
        count=rows.count(), limit=limit, offset=offset, items=list(rows[offset : offset + limit])
    )
