"""The slot row: read and write a host's django-q ``Schedule`` (docs/concepts.md).

The writes here run inside an alarm transaction (``transactions.py`` calls
:func:`apply_checkpoint` just before it commits); the services on the slot are in ``alarm.py``.
"""

from __future__ import annotations

from datetime import datetime

from django_q.models import Schedule

from durable_agent import conf
from durable_agent.maintenance.types import Checkpoint
from durable_agent.models import Host


def slot_deadline(schedule: Schedule | None) -> datetime | None:
    """The deadline a schedule row holds, or None when it is disarmed or missing."""
    if schedule is None or schedule.repeats == 0:
        return None
    value: datetime = schedule.next_run
    return value


def apply_checkpoint(host: Host, checkpoint: Checkpoint) -> datetime | None:
    """Write the checkpoint's target to the host's schedule row (inside the alarm transaction)."""
    target = checkpoint.target()
    if checkpoint.intent is None or target == checkpoint.current:
        return target
    schedule = host.alarm
    if schedule is None:
        if target is None:
            return None
        schedule = Schedule.objects.create(
            name=f"durable_agent:host:{host.pk}",
            func=conf.alarm_task(),
            args=repr(host.pk),
            schedule_type=Schedule.ONCE,
            repeats=1,
            next_run=target,
            intended_date_kwarg="deadline",
            cluster=conf.alarm_cluster(),
        )
        Host.objects.filter(pk=host.pk).update(alarm=schedule)
        host.alarm = schedule
    elif target is None:
        Schedule.objects.filter(pk=schedule.pk).update(repeats=0)
        schedule.repeats = 0
    else:
        Schedule.objects.filter(pk=schedule.pk).update(next_run=target, repeats=1)
        schedule.next_run, schedule.repeats = target, 1
    checkpoint.current = target
    return target
