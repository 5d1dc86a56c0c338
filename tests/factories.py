"""One factory-boy factory per model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import factory
from factory.django import DjangoModelFactory

from durable_agent import models

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class HostFactory(DjangoModelFactory):
    class Meta:
        model = models.Host

    key = factory.Sequence(lambda n: f"host-{n}")
    single_thread = False


class MaintenanceStateFactory(DjangoModelFactory):
    class Meta:
        model = models.MaintenanceState

    host = factory.SubFactory(HostFactory)
    dirty = 1
    processed = 0


class DueLaneFactory(DjangoModelFactory):
    class Meta:
        model = models.DueLane

    host = factory.SubFactory(HostFactory)
    lane = factory.Sequence(lambda n: f"lane-{n}")
    revision = 1
    due_at = T0


class MutationTicketFactory(DjangoModelFactory):
    class Meta:
        model = models.MutationTicket

    host = factory.SubFactory(HostFactory)
    lanes = factory.LazyFunction(lambda: ["agent:native"])
    created_at = T0
    expires_at = factory.LazyAttribute(lambda o: o.created_at + timedelta(seconds=60))


class BindingRetryFactory(DjangoModelFactory):
    class Meta:
        model = models.BindingRetry

    host = factory.SubFactory(HostFactory)
    thread = factory.Sequence(lambda n: f"thread-{n}")
    submission = factory.Sequence(lambda n: f"submission-{n}")
    reported_at = T0


class WorkCursorFactory(DjangoModelFactory):
    class Meta:
        model = models.WorkCursor

    host = factory.SubFactory(HostFactory)
    thread = factory.Sequence(lambda n: f"thread-{n}")
    cursor = "page-1"


class RecoveryFaultFactory(DjangoModelFactory):
    class Meta:
        model = models.RecoveryFault

    host = factory.SubFactory(HostFactory)
    thread = factory.Sequence(lambda n: f"thread-{n}")
    first_failed_at = T0
    last_failed_at = T0
    retry_at = factory.LazyAttribute(lambda o: o.last_failed_at + timedelta(seconds=5))
    failure = factory.LazyFunction(lambda: {"phase": "recovery", "reason": "failure"})


class RecoveryEventFactory(DjangoModelFactory):
    class Meta:
        model = models.RecoveryEvent

    host = factory.SubFactory(HostFactory)
    sequence = factory.Sequence(lambda n: n + 1)
    transition = models.RecoveryTransition.CREATED
    thread = "thread-0"
    submission = "submission-0"
    occurred_at = T0
    first_failed_at = T0


class AlarmAuditFactory(DjangoModelFactory):
    class Meta:
        model = models.AlarmAudit

    host = factory.SubFactory(HostFactory)
    actor = "tester"
    generation = 1
    at = T0


class PassRecordFactory(DjangoModelFactory):
    class Meta:
        model = models.PassRecord

    host = factory.SubFactory(HostFactory)
    started_at = T0
    phase = models.PassPhase.CAUGHT_UP


class ThreadFactory(DjangoModelFactory):
    class Meta:
        model = models.Thread

    host = factory.SubFactory(HostFactory)
    key = factory.Sequence(lambda n: f"thread-{n}")
    created_at = T0


class SubmissionFactory(DjangoModelFactory):
    """A ``ready`` submission at the end of its thread (``sequence`` counts per factory)."""

    class Meta:
        model = models.Submission

    thread = factory.SubFactory(ThreadFactory)
    host = factory.LazyAttribute(lambda o: o.thread.host)
    sequence = factory.Sequence(lambda n: n + 1)
    agent = "echo"
    agent_version = "1"
    payload = factory.LazyFunction(dict)
    idempotency_key = factory.Sequence(lambda n: f"key-{n}")
    state = models.SubmissionState.READY
    created_at = T0
    updated_at = T0
