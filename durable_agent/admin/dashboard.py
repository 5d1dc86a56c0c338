"""The maintenance dashboard: upcoming alarms, pass lateness, and the hosts that need a look."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import F

from durable_agent.admin import charts, queries
from durable_agent.admin import formatting as fmt
from durable_agent.maintenance import selectors
from durable_agent.models import DueLane, Host, PassRecord, RecoveryFault

UPCOMING_LIMIT = 30
LATENESS_SAMPLE = 500
LIST_LIMIT = 20


@dataclass(frozen=True)
class Item:
    """One line of a dashboard list: a host link and what is wrong with it."""

    host: str
    url: str
    what: str
    when: str
    note: str = ""


@dataclass(frozen=True)
class Dashboard:
    now: str
    counts: queries.DashboardCounts
    timeline: charts.Timeline
    histogram: charts.Histogram
    phases: tuple[tuple[str, int], ...]
    overdue: tuple[Item, ...]
    parked: tuple[Item, ...]
    faults: tuple[Item, ...]
    failing: tuple[Item, ...] = ()


def _failing_item(host: Host, host_url: Callable[[int], str]) -> Item:
    error = str(getattr(host, "last_error", "") or "")
    return Item(
        host.key,
        host_url(host.pk),
        f"{getattr(host, 'failed_passes', 0)} failed passes in a row",
        fmt.timestamp(getattr(host, "last_pass_at", None)),
        error.splitlines()[0][:160] if error else "",
    )


def load(now: datetime, host_url: Callable[[int], str]) -> Dashboard:
    """Read the dashboard (a constant number of queries, whatever the number of hosts)."""
    counts = queries.dashboard_counts(now)
    armed = (
        Host.objects.armed()
        .select_related("alarm")
        .order_by("alarm__next_run", "key")[:UPCOMING_LIMIT]
    )
    alarms = [charts.Alarm(h.key, host_url(h.pk), h.alarm.next_run) for h in armed if h.alarm]
    recent = list(
        PassRecord.objects.order_by("-started_at", "-id").values_list("phase", "lateness_ms")[
            :LATENESS_SAMPLE
        ]
    )
    lateness = [value for _, value in recent if value is not None]
    overdue = (
        Host.objects.filter(queries.overdue(now))
        .select_related("alarm")
        .order_by("alarm__next_run", "key")[:LIST_LIMIT]
    )
    parked = DueLane.objects.parked().select_related("host").order_by("host__key", "lane")
    faults = RecoveryFault.objects.select_related("host").order_by("retry_at", "pk")
    failing = (
        selectors.annotate_hosts(Host.objects.all())
        .filter(selectors.failing())
        .order_by(F("failed_passes").desc(), "key")[:LIST_LIMIT]
    )
    return Dashboard(
        now=fmt.timestamp(now),
        counts=counts,
        timeline=charts.timeline(alarms, now, overdue_after=queries.OVERDUE_AFTER),
        histogram=charts.histogram(lateness),
        phases=tuple(sorted(Counter(phase for phase, _ in recent).items())),
        overdue=tuple(
            Item(
                h.key,
                host_url(h.pk),
                "slot overdue",
                fmt.timestamp(h.alarm.next_run),
                f"by {fmt.duration_between(now, h.alarm.next_run)}",
            )
            for h in overdue
            if h.alarm
        ),
        parked=tuple(
            Item(
                lane.host.key,
                host_url(lane.host_id),
                f"lane {lane.lane} parked",
                fmt.timestamp(lane.due_at) if lane.due_at else "",
                f"{lane.stalls} stalls",
            )
            for lane in parked[:LIST_LIMIT]
        ),
        faults=tuple(
            Item(
                fault.host.key,
                host_url(fault.host_id),
                f"thread {fault.thread}: {fault.attempts} failed "
                + ("recovery" if fault.attempts == 1 else "recoveries"),
                fmt.timestamp(fault.retry_at),
                f"retry {fmt.relative(fault.retry_at, now)}",
            )
            for fault in faults[:LIST_LIMIT]
        ),
        failing=tuple(_failing_item(h, host_url) for h in failing),
    )
