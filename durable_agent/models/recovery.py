"""Binding retries, work cursors, recovery faults and recovery events.

"thread" and "submission" are the runtime's identifiers (strings), not foreign keys: the core
works with any runtime.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Length
from django.db.models.lookups import LessThanOrEqual

from durable_agent.models.host import Host

MAX_CURSOR_LENGTH = 8192


class BindingRetry(models.Model):
    """A head parked because its agent binding is unavailable (upstream ``bindingWaits``).

    A stable wait: no alarm, one error log, until the binding registry key changes or an
    operator retries it.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="binding_retries")
    thread = models.CharField(max_length=256)
    submission = models.CharField(max_length=256)
    attempts = models.IntegerField(default=1)
    reported_at = models.DateTimeField()
    registry_key = models.CharField(max_length=128, blank=True, default="")

    class Meta:
        verbose_name_plural = "binding retries"
        constraints = [
            models.UniqueConstraint(
                fields=["host", "submission"], name="da_bindingretry_one_per_submission"
            ),
            models.CheckConstraint(
                condition=Q(attempts__gte=0), name="da_bindingretry_attempts_nonnegative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host_id}:{self.thread}/{self.submission}"


class WorkCursor(models.Model):
    """Where paged recovery of one thread resumes after a crash."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="work_cursors")
    thread = models.CharField(max_length=256)
    cursor = models.TextField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "thread"], name="da_workcursor_one_per_thread"),
            models.CheckConstraint(
                condition=Q(LessThanOrEqual(Length("cursor"), MAX_CURSOR_LENGTH)) & ~Q(cursor=""),
                name="da_workcursor_cursor_length",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host_id}:{self.thread}"


class RecoveryFault(models.Model):
    """A thread whose recovery failed; retried after 5 s, 10, 20, 40, 60, 60 ..."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="recovery_faults")
    thread = models.CharField(max_length=256)
    first_failed_at = models.DateTimeField()
    last_failed_at = models.DateTimeField()
    retry_at = models.DateTimeField()
    attempts = models.IntegerField(default=1)
    # phase, reason, operation, diagnostic: never payload bytes.
    failure = models.JSONField(default=dict)
    recipients = models.JSONField(default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "thread"], name="da_fault_one_per_thread"),
            models.CheckConstraint(
                condition=Q(attempts__gte=1, attempts__lte=2**31 - 1),
                name="da_fault_attempts_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host_id}:{self.thread} x{self.attempts}"


class RecoveryTransition(models.TextChoices):
    CREATED = "created", "created"
    CHANGED = "changed", "changed"
    CLEARED = "cleared", "cleared"


class RecoveryEvent(models.Model):
    """One recovery-fault transition, delivered in sequence order, at least once."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="recovery_events")
    sequence = models.BigIntegerField()
    transition = models.CharField(max_length=8, choices=RecoveryTransition.choices)
    thread = models.CharField(max_length=256)
    submission = models.CharField(max_length=256)
    occurred_at = models.DateTimeField()
    first_failed_at = models.DateTimeField()
    failure = models.JSONField(default=dict)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["host", "sequence"], name="da_event_one_per_sequence"),
            models.CheckConstraint(condition=Q(sequence__gte=1), name="da_event_sequence_positive"),
            models.CheckConstraint(
                condition=Q(transition__in=RecoveryTransition.values),
                name="da_event_transition_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host_id}#{self.sequence} {self.transition}"
