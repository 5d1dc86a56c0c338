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
  ``durable_agent_submissions_owed``, ``durable_agent_needs_operator{reason}`` (three more
  queries: work waiting for a person), and ``durable_agent_fleet_up``: 1 when they were read.
  When the database fails (Note [A scrape without the database]) the scrape still answers 200
  with the pass metrics and ``durable_agent_fleet_up 0``; the other fleet gauges are left out,
  so a dashboard shows a gap, never a stale or zero count.

:func:`metrics_view` answers both in the text exposition format; mount it on a path only your
Prometheus can reach (it checks no credentials)::

    from durable_agent.contrib.metrics import metrics_view
    urlpatterns = [path("internal/metrics", metrics_view)]

Importing this module without ``prometheus_client`` raises ImportError; durable_agent itself
only imports it when the package is installed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from django.db import Error as DatabaseFailure
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

from durable_agent import signals
from durable_agent.maintenance.operators.attention import attention
from durable_agent.maintenance.store.selectors import fleet_snapshot

__all__ = ["FLEET_REGISTRY", "FleetCollector", "metrics_view", "observe_pass"]

logger = logging.getLogger("durable_agent.metrics")

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
    """Count one recorded pass."""
    PASSES.labels(phase=phase).inc()
    PASS_DURATION.observe(duration_s)
    if lateness_ms is not None:
        PASS_LATENESS.observe(max(lateness_ms, 0) / 1000)


def _count_pass(sender: object, *, report: Any, duration_s: float, **kwargs: Any) -> None:
    """The receiver of ``pass_finished``: every recorded pass is counted once, when its
    record commits (``durable_agent.apps`` imports this module when ``prometheus_client`` is
    installed)."""
    observe_pass(report.phase, duration_s, report.lateness_ms)


signals.pass_finished.connect(_count_pass, dispatch_uid="durable_agent.contrib.metrics")


FLEET_UP_HELP = "1 when the fleet gauges were read from the database, 0 when it failed."


class FleetCollector(Collector):
    """Gauges of the whole fleet, read from the database when scraped.

    Note [A scrape without the database]
        A database that is down or refuses the queries must not cost the scrape: the pass
        metrics live in the process and are what an operator needs most during the outage.
        A database error while reading the fleet yields ``durable_agent_fleet_up 0`` and no
        other fleet gauge. The failure is logged (WARNING) when the database goes from up to
        down as this process sees it, and again when it is back (INFO), not on every scrape.
    """

    database_down = False

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = fleet_snapshot()
            counts = attention(failing_hosts=snapshot.failing)
        except DatabaseFailure as exc:
            if not FleetCollector.database_down:
                FleetCollector.database_down = True
                logger.warning(
                    "Fleet gauges unavailable, the database failed: %s: %s",
                    type(exc).__name__,
                    exc,
                    extra={"action": "metrics_fleet_down"},
                )
            yield GaugeMetricFamily("durable_agent_fleet_up", FLEET_UP_HELP, value=0)
            return
        if FleetCollector.database_down:
            FleetCollector.database_down = False
            logger.info("Fleet gauges read again", extra={"action": "metrics_fleet_up"})
        yield GaugeMetricFamily("durable_agent_fleet_up", FLEET_UP_HELP, value=1)
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
