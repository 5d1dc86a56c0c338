"""Retention: the sweep prunes old rows of the growing tables in small batches.

Each call of :func:`prune` deletes at most ``RETENTION_BATCH_SIZE`` rows of each table, by
primary key, each table in its own short transaction, so the sweep never holds long locks and a
large backlog drains over several sweeps. Ages are measured against :mod:`durable_agent.clock`.

What is never deleted:

- an undelivered ``RecoveryEvent`` (``delivered_at`` unset, or a sequence above the host's
  ``recovery_event_acknowledged``);
- a ``PassRecord`` that no later successful pass of its host follows: the latest pass, the
  latest successful one and the failure streak after it stay (the read model reads them);
- a ``Submission`` that is not settled, or the last submission of its thread (settled or
  not): the next sequence number of a thread follows its last one, so a thread never
  reuses a sequence (its settled history before that goes, with the idempotency keys it
  held: a key older than the retention is admitted again);
- a live ``MutationTicket``, or one expired less than an hour ago (audits report those);
- any django-q ``OrmQ`` row: each is a message still pending, or one a cluster has taken and
  will hand out again if its worker died; django-q deletes it on acknowledgement;
- django-q ``Task`` rows of other functions than the alarm task.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django_q.models import Task

from durable_agent import clock, conf
from durable_agent.maintenance.store.selectors import SUCCEEDED
from durable_agent.models import (
    AlarmAudit,
    MutationTicket,
    PassRecord,
    RecoveryEvent,
    Submission,
    SubmissionState,
)

logger = logging.getLogger("durable_agent.retention")
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


def settled_submissions(now: datetime, age: timedelta) -> QuerySet[Submission]:
    """Submissions settled longer ago than ``age`` that a later submission of their thread
    follows (served by ``da_submission_settled``): work in flight, and the last submission
    of each thread, always stay."""
    later = Submission.objects.filter(
        thread_id=OuterRef("thread_id"), sequence__gt=OuterRef("sequence")
    )
    return Submission.objects.filter(
        state=SubmissionState.SETTLED, settled_at__lte=now - age
    ).filter(Exists(later))


def prune(now: datetime | None = None) -> dict[str, int]:
    """Delete one batch of expired rows per table; return how many rows of each went.

    A table whose deletion fails is logged and reported as 0; the others are still pruned.
    """
    now = now or clock.now()
    batch = conf.retention_batch_size()
    tables: list[tuple[str, QuerySet[Any] | None, str]] = []
    passes = conf.retention_pass_records()
    tables.append(
        ("pruned_pass_records", None if passes is None else pass_records(now, passes), "started_at")
    )
    audits = conf.retention_audits()
    tables.append(
        (
            "pruned_audits",
            None if audits is None else AlarmAudit.objects.filter(at__lte=now - audits),
            "at",
        )
    )
    events = conf.retention_recovery_events()
    delivered = None
    if events is not None:
        delivered = RecoveryEvent.objects.filter(
            delivered_at__isnull=False,
            delivered_at__lte=now - events,
            sequence__lte=F("host__maintenance__recovery_event_acknowledged"),
        )
    tables.append(("pruned_recovery_events", delivered, "delivered_at"))
    tickets = MutationTicket.objects.filter(expires_at__lte=now - TICKET_GRACE)
    tables.append(("expired_tickets", tickets, "expires_at"))
    tasks = conf.retention_tasks()
    results = None
    if tasks is not None:
        funcs = sorted({conf.alarm_task(), conf.get_default("ALARM_TASK"), conf.BATCH_ALARM_TASK})
        results = Task.objects.filter(func__in=funcs, stopped__lte=now - tasks)
    tables.append(("pruned_tasks", results, "stopped"))
    submissions = conf.retention_submissions()
    settled = None if submissions is None else settled_submissions(now, submissions)
    tables.append(("pruned_submissions", settled, "settled_at"))
    pruned: dict[str, int] = {}
    for key, queryset, order_by in tables:
        pruned[key] = 0
        if queryset is None:
            continue
        try:
            pruned[key] = _delete_batch(queryset, order_by=order_by, batch=batch)
        except DatabaseError:
            logger.exception("Retention could not prune %s", queryset.model.__name__)
    return pruned
