"""A django-health-check backend: the maintenance fleet (needs ``django-health-check``).

Add it to the project's health view::

    from health_check.views import HealthCheckView
    urlpatterns = [
        path("ht/", HealthCheckView.as_view(checks=[
            "health_check.checks.Database",
            "durable_agent.contrib.health_checks.Fleet",
        ])),
    ]

Unavailable when a host is overdue (its alarm is not being fired) or failing (its latest pass
failed); a warning (degraded, not down) when a lane is parked or work waits for a person
(unknown or suspended submissions, heads parked on a missing binding). The message counts,
never names.
"""

from __future__ import annotations

import dataclasses

from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable, ServiceWarning

from durable_agent.maintenance.operators.attention import attention
from durable_agent.maintenance.store.selectors import fleet_snapshot


@dataclasses.dataclass
class Fleet(HealthCheck):  # type: ignore[misc]
    """Every host is fired on time and its passes succeed; no lane is parked."""

    def run(self) -> None:
        snapshot = fleet_snapshot()
        problems = []
        if snapshot.overdue:
            problems.append(f"{snapshot.overdue} host(s) overdue")
        if snapshot.failing:
            problems.append(f"{snapshot.failing} host(s) failing")
        if problems:
            raise ServiceUnavailable(", ".join(problems))
        warnings = [f"{snapshot.parked} lane(s) parked"] if snapshot.parked else []
        waiting = attention(failing_hosts=0)
        if waiting.total:
            warnings.append(f"work waits for an operator: {waiting.describe()}")
        if warnings:
            raise ServiceWarning(", ".join(warnings))
