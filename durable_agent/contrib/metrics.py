"""Prometheus metrics (the ``[metrics]`` extra: ``prometheus_client``).

Two kinds (docs/operations.md):

* **Pass metrics**, counted in the process that runs the pass (a django-q worker, or a
  ``manage.py`` command), in ``prometheus_client``'s default registry:
  ``durable_agent_passes_total{phase}``, ``durable_agent_pass_duration_seconds`` and
  ``durable_agent_pass_lateness_seconds`` (histograms). Expose them from the workers (see
  docs/operations.md), or with ``prometheus_client``'s multiprocess mode.
* **Fleet gauges**, read from the database on each scrape (:class:`FleetCollector`, nine
  queries whatever the number of hosts): ``durable_agent_hosts``,
  ``durable_agent_hosts_armed``, ``durable_agent_hosts_overdue``,
  ``durable_agent_hosts_failing``, ``durable_agent_lanes_parked``,
  ``durable_agent_submissions_owed``, and ``durable_agent_needs_operator{reason}`` (three more
  queries: work waiting for a person).

:func:`metrics_view` answers both in the text exposition format; mount it on a path only your
Prometheus can reach (it checks no credentials)::

    from durable_agent.contrib.metrics import metrics_view
    urlpatterns = [path("internal/metrics", metrics_view)]

Importing this module without ``prometheus_client`` raises ImportError; durable_agent itself
only imports it when the package is installed.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from durable_agent.maintenance.operators.attention import attention
from durable_agent.observability import fleet_snapshot

__all__ = ["FLEET_REGISTRY", "FleetCollector", "metrics_view", "observe_pass"]

PASSES = Counter(
    "durable_agent_passes",
    "Maintenance passes recorded, by phase (caught-up, actionable, busy, failed).",
    ["phase"],
)
PASS_DURATION = Histogram(
    "durable_agent_pass_duration_seconds",
    "Wall time of a recorded maintenance pass.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
PASS_LATENESS = Histogram(
    "durable_agent_pass_lateness_seconds",
    "How long after its alarm's deadline a fired pass started (early starts count as 0).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 300, 3600),
)


def observe_pass(phase: str, duration_s: float, lateness_ms: int | None) -> None:
    """Count one recorded pass (called by ``durable_agent.observability.pass_recorded``)."""
    PASSES.labels(phase=phase).inc()
    PASS_DURATION.observe(duration_s)
    if lateness_ms is not None:
        PASS_LATENESS.observe(max(lateness_ms, 0) / 1000)


class FleetCollector(Collector):
    """Gauges of the whole fleet, read from the database when scraped."""

    def collect(self) -> Iterator[Metric]:
        snapshot = fleet_snapshot()
        for name, help_text, value in (
            ("durable_agent_hosts", "Hosts.", snapshot.hosts),
            ("durable_agent_hosts_armed", "Hosts whose alarm slot is armed.", snapshot.armed),
            (
                "durable_agent_hosts_overdue",
                "Hosts armed more than 60 s past their slot's time (not being fired).",
                snapshot.overdue,
            ),
            (
                "durable_agent_hosts_failing",
                "Hosts whose last FAILING_AFTER_PASSES passes failed.",
                snapshot.failing,
            ),
            ("durable_agent_lanes_parked", "Parked lanes, across hosts.", snapshot.parked),
            (
                "durable_agent_submissions_owed",
                "Submissions not settled (ready, running, suspended, unknown).",
                snapshot.owed,
            ),
        ):
            yield GaugeMetricFamily(name, help_text, value=value)
        waiting = GaugeMetricFamily(
            "durable_agent_needs_operator",
            "Work waiting for a person, by reason (unknown, suspended, binding, failing_host).",
            labels=["reason"],
        )
        counts = attention(failing_hosts=snapshot.failing)
        for reason, value in (
            ("unknown", counts.unknown),
            ("suspended", counts.suspended),
            ("binding", counts.binding_waits),
            ("failing_host", counts.failing_hosts),
        ):
            waiting.add_metric([reason], value)
        yield waiting


FLEET_REGISTRY = CollectorRegistry(auto_describe=False)
FLEET_REGISTRY.register(FleetCollector())


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The process's metrics (the default registry) and the fleet gauges, for Prometheus."""
    body = generate_latest(REGISTRY) + generate_latest(FLEET_REGISTRY)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
