"""Retention: the sweep prunes old rows of the growing tables in small batches.

Each call of :func:`prune` deletes at most ``RETENTION_BATCH_SIZE`` rows of each table, by
primary key, each table in its own short transaction, so the sweep never holds long locks and a
large backlog drains over several sweeps. Ages are measured against :mod:`durable_agent.clock`.

What is never deleted:

- an undelivered ``RecoveryEvent`` (``delivered_at`` unset, or a sequence above the host's
  ``recovery_event_acknowledged``);
- a ``PassRecord`` that no later successful pass of its host follows: the latest pass, the
  latest successful one and the failure streak after it stay (the read model reads them);
- a live ``MutationTicket``, or one expired less than an hour ago (audits report those);
- any django-q ``OrmQ`` row: each is a message still pending, or one a cluster has taken and
  will hand out again if its worker died; django-q deletes it on acknowledgement;
- django-q ``Task`` rows of other functions than the alarm task.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django_q.models import Task

from durable_agent import clock, conf
from durable_agent.maintenance.selectors import SUCCEEDED
from durable_agent.models import AlarmAudit, MutationTicket, PassRecord, RecoveryEvent

TICKET_GRACE = timedelta(hours=1)


def _delete_batch(queryset: QuerySet[Any], *, order_by: str, batch: int) -> int:
    """Delete the first ``batch`` rows of ``queryset`` by primary key in one transaction."""
    with transaction.atomic():
        pks = list(queryset.order_by(order_by).values_list("pk", flat=True)[:batch])
        if not pks:
            return 0
        # The filter is repeated: a row that no longer qualifies is not deleted.
        deleted, _ = queryset.filter(pk__in=pks).delete()
    return int(deleted)


def pass_records(now: datetime, age: timedelta) -> QuerySet[PassRecord]:
    """Pass records older than ``age`` that a later successful pass of their host follows.

    What the read model derives from the history is never changed: the latest pass, the
    latest successful one and every pass after it (the failure streak) all stay.
    """
    later_success = PassRecord.objects.filter(
        host_id=OuterRef("host_id"), phase__in=SUCCEEDED
    ).filter(
        Q(started_at__gt=OuterRef("started_at"))
        | Q(started_at=OuterRef("started_at"), id__gt=OuterRef("id"))
    )
    return PassRecord.objects.filter(started_at__lte=now - age).filter(Exists(later_success))


def prune(now: datetime | None = None) -> dict[str, int]:
    """Delete one batch of expired rows per table; return how many rows of each went."""
    now = now or clock.now()
    batch = conf.retention_batch_size()
    pruned = {
        "pruned_pass_records": 0,
        "pruned_audits": 0,
        "pruned_recovery_events": 0,
        "expired_tickets": 0,
        "pruned_tasks": 0,
    }
    passes = conf.retention_pass_records()
    if passes is not None:
        pruned["pruned_pass_records"] = _delete_batch(
            pass_records(now, passes), order_by="started_at", batch=batch
        )
    audits = conf.retention_audits()
    if audits is not None:
        pruned["pruned_audits"] = _delete_batch(
            AlarmAudit.objects.filter(at__lte=now - audits), order_by="at", batch=batch
        )
    events = conf.retention_recovery_events()
    if events is not None:
        delivered = RecoveryEvent.objects.filter(
            delivered_at__isnull=False,
            delivered_at__lte=now - events,
            sequence__lte=F("host__maintenance__recovery_event_acknowledged"),
        )
        pruned["pruned_recovery_events"] = _delete_batch(
            delivered, order_by="delivered_at", batch=batch
        )
    pruned["expired_tickets"] = _delete_batch(
        MutationTicket.objects.filter(expires_at__lte=now - TICKET_GRACE),
        order_by="expires_at",
        batch=batch,
    )
    tasks = conf.retention_tasks()
    if tasks is not None:
        funcs = sorted({conf.alarm_task(), conf.get_default("ALARM_TASK")})
        pruned["pruned_tasks"] = _delete_batch(
            Task.objects.filter(func__in=funcs, stopped__lte=now - tasks),
            order_by="stopped",
            batch=batch,
        )
    return pruned
