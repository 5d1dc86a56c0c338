"""The task every system runs: record that timer ``key`` ran, and when it started.

One function body, wrapped once per system: a durable_agent host-lane handler (and a trivial
agent for the immediate scenario's ``submit()``), a plain function
for django-q2 ``Schedule`` rows, a procrastinate task (found by its Django app's autodiscovery
of ``tasks`` modules), a django-tasks task. Celery's wrapper is in ``celery_app.py``.
"""

from __future__ import annotations

import time
from typing import Any

from django_tasks import task as django_task
from procrastinate.contrib.django import app as procrastinate_app

import durable_agent

LANE = "peers"
AGENT = "peers-record"


def record(system: str, key: str) -> None:
    started = time.time()
    from bench.peers.models import Run

    Run.objects.create(system=system, key=key, started=started)


def run_lane(ctx: Any) -> None:
    """The durable_agent host lane: one row per wave, the host's key as the timer."""
    record("da", ctx.host.key)


@durable_agent.agent(AGENT, version="1")
def agent_record(ctx: Any, payload: dict[str, Any]) -> None:
    """The trivial agent of the immediate scenario: its first line records the timer."""
    record("da", payload["key"])


@procrastinate_app.task(name="bench.peers.record")
def procrastinate_record(system: str, key: str) -> None:
    record(system, key)


@django_task()
def django_tasks_record(system: str, key: str) -> None:
    record(system, key)
