"""Read-only queries behind the admin pages (no writes here or anywhere in the admin).

The changelist annotations keep the host list at a constant number of queries per page: every
per-host figure is a correlated subquery or a join, never a query per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    Case,
    Count,
    DateTimeField,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from durable_agent.maintenance.audit import OVERDUE_AFTER
from durable_agent.models import (
    BindingRetry,
    DueLane,
    Host,
    LaneState,
    PassRecord,
    RecoveryFault,
)

__all__ = [
    "OVERDUE_AFTER",
    "annotate_hosts",
    "dashboard_counts",
    "faulted",
    "overdue",
    "parked",
]


def _count(queryset: QuerySet[Any]) -> Coalesce:
    """A correlated ``COUNT(*)`` of ``queryset`` rows of the outer host (0 when none)."""
    counted = (
        queryset.filter(host=OuterRef("pk"))
        .order_by()
        .values("host")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def _last_pass(field: str) -> Subquery:
    latest = PassRecord.objects.filter(host=OuterRef("pk")).order_by("-started_at", "-id")
    return Subquery(latest.values(field)[:1])


def annotate_hosts(queryset: QuerySet[Host]) -> QuerySet[Host]:
    """Every figure the host changelist shows, as annotations.

    ``gen_dirty``/``gen_processed`` read a missing state row as ``1``/``0`` (one useful pass
    classifies whatever exists); ``slot_at`` is the armed slot time (None when disarmed).
    """
    return queryset.annotate(
        gen_dirty=Coalesce(F("maintenance__dirty"), Value(1)),
        gen_processed=Coalesce(F("maintenance__processed"), Value(0)),
        gen_lag=F("gen_dirty") - F("gen_processed"),
        slot_at=Case(
            When(Q(alarm__isnull=True) | Q(alarm__repeats=0), then=Value(None)),
            default=F("alarm__next_run"),
            output_field=DateTimeField(),
        ),
        parked_lanes=_count(DueLane.objects.filter(state=LaneState.PARKED)),
        open_faults=_count(RecoveryFault.objects.all()),
        binding_waits=_count(BindingRetry.objects.all()),
        last_pass_phase=_last_pass("phase"),
        last_pass_lateness=_last_pass("lateness_ms"),
        last_pass_at=_last_pass("started_at"),
    )


# -- the states the filters and the dashboard count (on annotated or plain querysets) ----------


def overdue(now: datetime) -> Q:
    """Armed slots more than ``OVERDUE_AFTER`` in the past: the scheduler is not firing them."""
    return (
        Q(alarm__isnull=False) & ~Q(alarm__repeats=0) & Q(alarm__next_run__lt=now - OVERDUE_AFTER)
    )


def parked() -> Exists:
    return Exists(DueLane.objects.filter(host=OuterRef("pk"), state=LaneState.PARKED))


def faulted() -> Exists:
    return Exists(RecoveryFault.objects.filter(host=OuterRef("pk")))


def waiting_binding() -> Exists:
    return Exists(BindingRetry.objects.filter(host=OuterRef("pk")))


def dirty() -> Q:
    """A dirty generation (a missing state row counts as dirty)."""
    return Q(maintenance__isnull=True) | Q(maintenance__dirty__gt=F("maintenance__processed"))


@dataclass(frozen=True)
class DashboardCounts:
    hosts: int
    armed: int
    due: int
    overdue: int
    parked: int
    faulted: int
    waiting_binding: int
    dirty: int


def dashboard_counts(now: datetime) -> DashboardCounts:
    """Host counts by state, in one aggregate query."""
    armed = Q(alarm__isnull=False) & ~Q(alarm__repeats=0)
    figures = Host.objects.annotate(
        is_parked=parked(), is_faulted=faulted(), is_waiting=waiting_binding()
    ).aggregate(
        hosts=Count("pk"),
        armed=Count("pk", filter=armed),
        due=Count("pk", filter=armed & Q(alarm__next_run__lte=now)),
        overdue=Count("pk", filter=overdue(now)),
        parked=Count("pk", filter=Q(is_parked=True)),
        faulted=Count("pk", filter=Q(is_faulted=True)),
        waiting_binding=Count("pk", filter=Q(is_waiting=True)),
        dirty=Count("pk", filter=dirty()),
    )
    return DashboardCounts(**{key: int(value or 0) for key, value in figures.items()})


def overdue_by(slot: datetime | None, now: datetime) -> timedelta | None:
    """How late an armed slot is (None when it is not yet due)."""
    if slot is None or slot > now:
        return None
    return now - slot
