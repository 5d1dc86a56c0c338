"""Read-only queries behind the admin pages (no writes here or anywhere in the admin).

The states and per-host figures are those of the shared read model,
:mod:`durable_agent.maintenance.store.selectors` (the API, the audit and the health endpoint
read the same definitions). Every per-host figure is a correlated subquery or a join, never a
query per row, so the host list runs a constant number of queries per page.
"""

from __future__ import annotations

from durable_agent.maintenance.store.selectors import (
    OVERDUE_AFTER,
    FleetCounts,
    annotate_hosts,
    dirty,
    dirty_hosts,
    failing,
    failing_hosts,
    faulted,
    fleet_counts,
    overdue,
    overdue_by,
    overdue_hosts,
    parked,
    parked_hosts,
    waiting_binding,
)

DashboardCounts = FleetCounts
dashboard_counts = fleet_counts

__all__ = [
    "OVERDUE_AFTER",
    "DashboardCounts",
    "annotate_hosts",
    "dashboard_counts",
    "dirty",
    "dirty_hosts",
    "failing",
    "failing_hosts",
    "faulted",
    "overdue",
    "overdue_by",
    "overdue_hosts",
    "parked",
    "parked_hosts",
    "waiting_binding",
]
