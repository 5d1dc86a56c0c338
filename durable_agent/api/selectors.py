"""Read-only queries behind the API's GET endpoints (a constant number of queries each)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, F, IntegerField, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from durable_agent import clock
from durable_agent.errors import HostNotFound
from durable_agent.maintenance.alarm import slot_deadline
from durable_agent.maintenance.audit import OVERDUE_AFTER, HostAudit, audit_host
from durable_agent.models import (
    AlarmAudit,
    BindingRetry,
    DueLane,
    Host,
    LaneState,
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


@dataclass(frozen=True)
class Page:
    count: int
    limit: int
    offset: int
    items: list[Any]


def _count(model: Any, **extra: Any) -> Coalesce:
    rows = (
        model.objects.filter(host=OuterRef("pk"), **extra)
        .order_by()
        .values("host")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(rows, output_field=IntegerField()), Value(0))


def _annotated_hosts() -> QuerySet[Host]:
    """Hosts with ``n_*`` annotations: generations (a missing state row reads 1/0) and counts."""
    return Host.objects.select_related("alarm").annotate(
        n_dirty=Coalesce(F("maintenance__dirty"), Value(1)),
        n_processed=Coalesce(F("maintenance__processed"), Value(0)),
        n_nonterminal=Coalesce(F("maintenance__nonterminal"), Value(0)),
        n_parked_lanes=_count(DueLane, state=LaneState.PARKED),
        n_faults=_count(RecoveryFault),
        n_binding_retries=_count(BindingRetry),
    )


def _overdue_q(now: datetime) -> Q:
    return (
        Q(alarm__isnull=False) & ~Q(alarm__repeats=0) & Q(alarm__next_run__lt=now - OVERDUE_AFTER)
    )


def _choose(queryset: QuerySet[Host], condition: Q, wanted: bool | None) -> QuerySet[Host]:
    if wanted is None:
        return queryset
    return queryset.filter(condition) if wanted else queryset.exclude(condition)


def is_overdue(slot: datetime | None, now: datetime) -> bool:
    """An armed slot more than a minute in the past: the scheduler is not firing it."""
    return slot is not None and slot < now - OVERDUE_AFTER


def host_page(*, filters: HostFilters, limit: int, offset: int) -> Page:
    """Hosts by key, with their generations and counts, filtered and paginated."""
    now = clock.now()
    hosts = _annotated_hosts()
    hosts = _choose(hosts, _overdue_q(now), filters.overdue)
    hosts = _choose(
        hosts,
        Q(Exists(DueLane.objects.filter(host=OuterRef("pk"), state=LaneState.PARKED))),
        filters.parked,
    )
    hosts = _choose(
        hosts, Q(Exists(RecoveryFault.objects.filter(host=OuterRef("pk")))), filters.faulted
    )
    hosts = _choose(hosts, Q(n_dirty__gt=F("n_processed")), filters.dirty)
    hosts = hosts.order_by("key")
    return Page(
        count=hosts.count(), limit=limit, offset=offset, items=list(hosts[offset : offset + limit])
    )


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
    state: MaintenanceState | None
    lanes: list[DueLane]
    binding_retries: list[BindingRetry]
    faults: list[RecoveryFault]
    recent_passes: list[PassRecord]
    invariant: HostAudit


def host_detail(key: str) -> HostDetail:
    """Everything the host page shows: state, slot, lanes, retries, faults, recent passes."""
    now = clock.now()
    host = get_host(key)
    state = MaintenanceState.objects.filter(host=host).first()
    lanes = list(DueLane.objects.filter(host=host).order_by("lane"))
    invariant = audit_host(
        host,
        now=now,
        state=state,
        lanes=lanes,
        registry_key=get_runtime().binding_registry_key(),
    )
    slot = slot_deadline(host.alarm)
    return HostDetail(
        host=host,
        slot=slot,
        overdue=is_overdue(slot, now),
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
