"""The alarm audit trail and the bounded history of passes."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from durable_agent.models.host import Host


class AlarmAudit(models.Model):
    """One manual rearm, unpark or retry: who, why, and what moved."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="alarm_audits")
    actor = models.CharField(max_length=200)
    action = models.CharField(max_length=64, default="rearm")
    reason = models.TextField(blank=True, default="")
    old_deadline = models.DateTimeField(null=True, blank=True)
    new_deadline = models.DateTimeField(null=True, blank=True)
    generation = models.BigIntegerField()
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["host", "-at"], name="da_audit_host_at"),
            models.Index(fields=["at"], name="da_audit_at"),  # retention
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(generation__gte=0), name="da_audit_generation_nonnegative"
            )
        ]

    def __str__(self) -> str:
        return f"{self.host_id} {self.action} by {self.actor}"


class PassPhase(models.TextChoices):
    CAUGHT_UP = "caught-up", "caught-up"
    ACTIONABLE = "actionable", "actionable"
    BUSY = "busy", "busy"
    FAILED = "failed", "failed"
    STALE = "stale", "stale"


class PassRecord(models.Model):
    """One maintenance pass: bounded history for the admin and metrics."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="pass_records")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    phase = models.CharField(max_length=16, choices=PassPhase.choices)
    recovered = models.IntegerField(default=0)
    settled = models.IntegerField(default=0)
    alarm = models.CharField(max_length=16, blank=True, default="")
    generation = models.BigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    deadline = models.DateTimeField(null=True, blank=True)
    # Big: a rearm into the distant past or a long outage is late by more than 2^31 ms.
    lateness_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["host", "-started_at"], name="da_pass_host_started"),
            models.Index(fields=["started_at"], name="da_pass_started"),  # retention
            # The failing hosts of the host lists (Note [Host filters at scale]).
            models.Index(
                fields=["host", "-started_at"],
                condition=Q(phase=PassPhase.FAILED),
                name="da_pass_failed",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host_id} {self.phase} at {self.started_at:%H:%M:%S}"
