"""The due queue (one row per lane of a host) and mutation tickets."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Q
from django.db.models.functions import Length
from django.db.models.lookups import LessThanOrEqual

from durable_agent.models.host import Host

MAX_STALLS = 8


class LaneState(models.TextChoices):
    IDLE = "idle", "idle"
    PENDING = "pending", "pending"
    PARKED = "parked", "parked"


class DueLaneQuerySet(models.QuerySet["DueLane"]):
    def due(self, *, now: datetime) -> DueLaneQuerySet:
        return self.filter(due_at__isnull=False, due_at__lte=now)

    def parked(self) -> DueLaneQuerySet:
        return self.filter(state=LaneState.PARKED)


class DueLane(models.Model):
    """Scheduling metadata of one kind of due work; the domain data stays elsewhere.

    Writes compare-and-set on ``revision``. Dormant rows are never deleted: a delete and
    re-insert could reuse a revision that an old wave still holds.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="lanes")
    lane = models.CharField(max_length=256)
    revision = models.BigIntegerField(default=0)
    due_at = models.DateTimeField(null=True, blank=True, help_text="Null = idle.")
    stalls = models.SmallIntegerField(default=0)
    progress_key = models.CharField(max_length=512, null=True, blank=True)
    not_before = models.DateTimeField(null=True, blank=True, help_text="Retry floor.")
    state = models.CharField(max_length=8, choices=LaneState.choices, default=LaneState.PENDING)
    reported = models.BooleanField(default=False, help_text="Parked notice already reported.")

    objects = DueLaneQuerySet.as_manager()

    class Meta:
        ordering = ["host", "lane"]
        constraints = [
            models.UniqueConstraint(fields=["host", "lane"], name="da_duelane_one_per_host_lane"),
            models.CheckConstraint(
                condition=Q(revision__gte=0), name="da_duelane_revision_nonnegative"
            ),
            models.CheckConstraint(
                condition=Q(stalls__gte=0, stalls__lte=MAX_STALLS), name="da_duelane_stalls_range"
            ),
            models.CheckConstraint(
                condition=Q(LessThanOrEqual(Length("progress_key"), 512))
                | Q(progress_key__isnull=True),
                name="da_duelane_progress_key_length",
            ),
            models.CheckConstraint(
                condition=Q(LessThanOrEqual(Length("lane"), 256)) & ~Q(lane=""),
                name="da_duelane_lane_length",
            ),
            models.CheckConstraint(
                condition=Q(state__in=LaneState.values), name="da_duelane_state_valid"
            ),
        ]
        indexes = [
            models.Index(fields=["due_at"], name="da_duelane_due_at"),
            # The parked hosts of the host lists (Note [Host filters at scale]).
            models.Index(
                fields=["host"], condition=Q(state=LaneState.PARKED), name="da_duelane_parked"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host_id}:{self.lane}@{self.revision}"


class MutationTicketQuerySet(models.QuerySet["MutationTicket"]):
    def live(self, *, now: datetime) -> MutationTicketQuerySet:
        return self.filter(expires_at__gt=now)


class MutationTicket(models.Model):
    """A mutation between its prearm and its end (upstream ``activeMutations``).

    Created in the prearm transaction, deleted when the mutation ends; a crashed process's
    ticket expires after ``MUTATION_TICKET_TTL_MS``.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="mutation_tickets")
    lanes = models.JSONField(default=list)
    invalidates_recovery = models.BooleanField(default=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    objects = MutationTicketQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["host", "expires_at"], name="da_ticket_host_expiry")]
        constraints = [
            models.CheckConstraint(
                condition=Q(expires_at__gt=models.F("created_at")),
                name="da_ticket_expires_after_creation",
            )
        ]

    def __str__(self) -> str:
        return f"ticket {self.pk} on {self.host_id}"
