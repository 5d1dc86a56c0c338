"""A django-q ORM broker that fires due alarm slots within ~0.1 s (the fast path).

django-q2's own scheduler scans the ``Schedule`` table only every ~30 s, inside the cluster's
sentinel. This broker keeps that scan as the backstop and adds a cheap probe to the pusher's
dequeue loop: at most every ``PROBE_INTERVAL`` seconds it asks whether any armed schedule is
due (an index-only lookup on the partial index ``da_schedule_armed_next_run``) and, when one
is, calls django-q's stock ``scheduler()`` at once. Firing semantics (ONCE / repeats, the
``deadline`` kwarg, the transactional enqueue) stay django-q's own.

Enable it in settings::

    Q_CLUSTER = {..., "orm": "default", "poll": 0.05,
                 "broker_class": "durable_agent.broker.AlarmBroker"}

Cost: one indexed ``EXISTS`` query per probe interval per cluster (10 queries/s at 0.1 s),
plus the backstop sweep (``durable_agent.tasks.sweep``, three indexed queries) once a minute.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db.models import Q
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import Schedule
from django_q.scheduler import scheduler

logger = logging.getLogger("durable_agent.broker")

PROBE_INTERVAL = 0.1


def due_schedules_exist(now: Any = None) -> bool:
    """Is any armed schedule this cluster runs due? (The scheduler's own filter.)"""
    now = now or timezone.now()
    mine = Q(cluster=Conf.CLUSTER_NAME)
    if Conf.CLUSTER_NAME == Conf.PREFIX:
        mine |= Q(cluster__isnull=True)
    due: bool = Schedule.objects.filter(mine, next_run__lt=now).exclude(repeats=0).exists()
    return due


class AlarmBroker(ORM):  # type: ignore[misc]
    """The ORM broker plus a due-slot probe that runs django-q's scheduler promptly."""

    probe_interval = PROBE_INTERVAL

    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key)
        self._next_probe = 0.0
        self._next_sweep = 0.0  # once at start: a restarted cluster re-arms lost alarms first

    def dequeue(self) -> Any:
        self.fire_due_alarms()
        self.sweep_if_due()
        return super().dequeue()

    def sweep_if_due(self) -> bool:
        """Run the backstop sweep (``durable_agent.tasks.sweep``) when the cluster starts and then
        every ``SWEEP_INTERVAL_MS`` (a minute by default)."""
        now = time.monotonic()
        if now < self._next_sweep:
            return False
        from durable_agent import conf
        from durable_agent.tasks import sweep

        self._next_sweep = now + int(conf.get("SWEEP_INTERVAL_MS")) / 1000

        try:
            sweep()
        except Exception:
            logger.exception("The alarm sweep failed")
            return False
        return True

    def fire_due_alarms(self) -> bool:
        """Probe (rate-limited) and run the scheduler when a slot is due; True if it ran."""
        now = time.monotonic()
        if now < self._next_probe:
            return False
        self._next_probe = now + self.probe_interval
        try:
            if not due_schedules_exist():
                return False
            scheduler(broker=self)
        except Exception:  # the stock 30 s scan remains the backstop
            logger.exception("Firing due alarm slots failed")
            return False
        return True
