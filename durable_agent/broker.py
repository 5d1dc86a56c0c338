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

Cost: one index probe (the earliest armed ``next_run``) per probe interval per cluster (10
queries/s at 0.1 s); a slot due before the next probe is waited for and fired on time (Note
[Wake at the deadline]),
plus the backstop sweep (``durable_agent.tasks.sweep``, three indexed queries, then one batch of
retention deletes per pruned table) once a minute.

It also makes a cluster stop when SIGTERM reaches its whole process group or cgroup (Note
[SIGTERM to the group]).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from datetime import datetime
from types import FrameType
from typing import Any

from django.db.models import Q
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import Schedule
from django_q.scheduler import scheduler
from django_q.signals import post_spawn

logger = logging.getLogger("durable_agent.broker")

PROBE_INTERVAL = 0.1


def _mine() -> Q:
    """The schedules this cluster runs (django-q's scheduler's own filter)."""
    mine = Q(cluster=Conf.CLUSTER_NAME)
    if Conf.CLUSTER_NAME == Conf.PREFIX:
        mine |= Q(cluster__isnull=True)
    return mine


def next_armed_run() -> datetime | None:
    """The earliest ``next_run`` of an armed schedule this cluster runs, or None.

    The first entry of the partial index ``da_schedule_armed_next_run``: one index probe,
    whatever the number of armed hosts.
    """
    first: datetime | None = earliest_armed().first()
    return first


def earliest_armed() -> Any:
    """The probe's query: armed schedules of this cluster by ``next_run`` (values only)."""
    return (
        Schedule.objects.filter(_mine())
        .exclude(repeats=0)
        .order_by("next_run")
        .values_list("next_run", flat=True)
    )


class AlarmBroker(ORM):  # type: ignore[misc]
    """The ORM broker plus a due-slot probe that runs django-q's scheduler promptly."""

    probe_interval = PROBE_INTERVAL

    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key)
        self._next_probe = 0.0
        self._last_fired: datetime | None = None
        self._next_sweep = 0.0  # once at start: a restarted cluster re-arms lost alarms first

    def ping(self) -> bool:
        """django-q's sentinel pings its broker first thing; see Note [SIGTERM to the group]."""
        if _in_sentinel():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return bool(super().ping())

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
        """Probe (rate-limited) and run the scheduler when a slot is due; True if it ran.

        Note [Wake at the deadline]
            The probe reads the earliest armed ``next_run``. A slot due before the next probe
            is waited for here, to the millisecond, and fired at once, so an alarm armed more
            than one probe interval ahead fires within milliseconds of its deadline; one armed
            closer than that fires at the next probe (at most ``probe_interval`` late). The
            wait never exceeds one probe interval, so the pusher's dequeue is delayed no more
            than by one ordinary poll. After a firing the next dequeue probes again at once, so
            alarms due close together each fire on time instead of one probe interval apart;
            a slot the scheduler could not fire (it logs why and rolls back) is retried at the
            probe rate, never in a tight loop.
        """
        now = time.monotonic()
        if now < self._next_probe:
            return False
        self._next_probe = now + self.probe_interval
        try:
            first = next_armed_run()
            if first is None:
                return False
            wait = (first - timezone.now()).total_seconds()
            if wait >= self.probe_interval:
                return False
            stuck = first == self._last_fired  # the last firing left this very slot armed
            if wait >= 0:  # django-q fires ``next_run < now``: wake just past the deadline
                time.sleep(wait + 0.001)
            scheduler(broker=self)
            self._last_fired = first
            if not stuck:  # while slots keep coming due, look again at once
                self._next_probe = 0.0
        except Exception:  # the stock 30 s scan remains the backstop
            logger.exception("Firing due alarm slots failed")
            return False
        return True


# Note [SIGTERM to the group]
#     django-q2's qcluster is a leader process (its SIGTERM handler stops the cluster), a
#     sentinel, and the sentinel's pusher, monitor and workers. The sentinel and its children
#     ignore SIGINT, so Ctrl-C reaches the leader alone; but they leave SIGTERM at its default.
#     When SIGTERM reaches every process at once (systemd's KillMode=control-group, `kill --
#     -PGID`, `timeout`, some container runtimes) they all die: the sentinel inside
#     stop_event.wait(), so the leader's stop_event.set() waits forever for the dead waiter's
#     acknowledgement, or, when only the workers die, the pusher blocks on the full task queue
#     nobody drains. Either way the cluster hangs in "stopping". So SIGTERM is made to mean what
#     it means to the leader: stop in order. The sentinel ignores it (set in AlarmBroker.ping(),
#     the first thing the sentinel does, before it forks its children); the pusher and monitor
#     inherit that and are stopped by the sentinel as usual; each worker ignores it unless its
#     timer says the sentinel is killing it for overrunning ``timeout`` (that kill is a SIGTERM
#     too), and finishes its task, then takes the sentinel's STOP. A worker's timer is the
#     ``timer`` local of django-q2's worker(), found on the stack when post_spawn fires: -1 idle,
#     the task's timeout (plus 3 s) while busy, 0 once the sentinel has counted it down.


def _in_sentinel() -> bool:
    """Whether this is a child process of a qcluster (its sentinel, when ping() runs)."""
    return multiprocessing.parent_process() is not None


def _worker_timer() -> Any:
    """The ``timer`` Value of the django-q2 worker() running this post_spawn, or None."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "worker" and "timer" in frame.f_locals:
            return frame.f_locals["timer"]
        frame = frame.f_back
    return None


def _worker_sigterm(sender: Any, **kwargs: Any) -> None:
    if not _in_sentinel():
        return
    timer = _worker_timer()
    if timer is None:  # an unknown django-q2: keep its default, die on SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        if timer.value == 0:  # the sentinel's timeout kill
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        # Otherwise SIGTERM reached the whole cluster: finish the task, then take the STOP.

    signal.signal(signal.SIGTERM, on_sigterm)


post_spawn.connect(_worker_sigterm, dispatch_uid="durable_agent.broker.worker_sigterm")
