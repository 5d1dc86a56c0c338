"""Hosts and their maintenance state (upstream: one Durable Object and its KV record)."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q


def armed() -> Q:
    """A host whose slot is armed (``maintenance/store/selectors.py`` re-exports this rule)."""
    return Q(alarm__isnull=False) & ~Q(alarm__repeats=0)


class HostQuerySet(models.QuerySet["Host"]):
    def armed(self) -> HostQuerySet:
        """Hosts whose slot is armed (:func:`armed`)."""
        return self.filter(armed())


class Host(models.Model):
    """The unit that owns one alarm slot, one maintenance state, its lanes and its threads."""

    key = models.SlugField(max_length=200, unique=True)
    single_thread = models.BooleanField(
        default=False, help_text="A single-thread host runs one head attempt at a time."
    )
    # The OneToOne makes "one alarm slot per host" structural.
    alarm = models.OneToOneField(
        "django_q.Schedule",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="durable_agent_host",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = HostQuerySet.as_manager()

    class Meta:
        ordering = ["key"]
        permissions = [("repair_host", "Can repair a host's alarm, lanes and retries")]
        indexes = [
            # The single-thread hosts of the host lists, by key (Note [Host filters at scale]).
            models.Index(
                fields=["key"], condition=Q(single_thread=True), name="da_host_single_thread"
            ),
        ]

    def __str__(self) -> str:
        return self.key


class MaintenanceState(models.Model):
    """Generations, cursors and the durable native backoff of one host.

    A missing row means ``dirty=1, processed=0``: one useful pass classifies whatever exists.
    """

    host = models.OneToOneField(
        Host, on_delete=models.CASCADE, primary_key=True, related_name="maintenance"
    )
    dirty = models.BigIntegerField(default=1)
    processed = models.BigIntegerField(default=0)
    nonterminal = models.IntegerField(default=0)
    last_served_thread = models.CharField(max_length=256, null=True, blank=True)
    last_recovered_thread = models.CharField(max_length=256, null=True, blank=True)
    last_after_native_lane = models.CharField(max_length=256, null=True, blank=True)
    binding_registry_key = models.CharField(max_length=128, null=True, blank=True)
    recovery_event_sequence = models.BigIntegerField(default=0)
    recovery_event_acknowledged = models.BigIntegerField(default=0)
    # The durable native backoff (upstream `retry`): all four set, or all four null.
    retry_generation = models.BigIntegerField(null=True, blank=True)
    retry_not_before = models.DateTimeField(null=True, blank=True)
    retry_native_only = models.BooleanField(null=True, blank=True)
    retry_stalls = models.SmallIntegerField(null=True, blank=True)
    # The pass lease (one pass per host at a time).
    pass_lease_owner = models.CharField(max_length=64, null=True, blank=True)
    pass_lease_expires_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(dirty__gte=0) & Q(processed__gte=0) & Q(nonterminal__gte=0),
                name="da_state_generations_nonnegative",
            ),
            models.CheckConstraint(
                condition=Q(recovery_event_sequence__gte=0)
                & Q(recovery_event_acknowledged__gte=0)
                & Q(recovery_event_acknowledged__lte=F("recovery_event_sequence")),
                name="da_state_event_sequence_order",
            ),
            models.CheckConstraint(
                condition=(
                    Q(
                        retry_generation__isnull=True,
                        retry_not_before__isnull=True,
                        retry_native_only__isnull=True,
                        retry_stalls__isnull=True,
                    )
                    | Q(
                        retry_generation__gte=0,
                        retry_not_before__isnull=False,
                        retry_native_only__isnull=False,
                        retry_stalls__gte=0,
                        retry_stalls__lte=30,
                    )
                ),
                name="da_state_retry_all_or_none",
            ),
            models.CheckConstraint(
                condition=Q(pass_lease_owner__isnull=True, pass_lease_expires_at__isnull=True)
                | Q(pass_lease_owner__isnull=False, pass_lease_expires_at__isnull=False),
                name="da_state_pass_lease_all_or_none",
            ),
        ]
        indexes = [
            # The dirty hosts of the host lists (Note [Host filters at scale]).
            models.Index(
                fields=["host"], condition=Q(dirty__gt=F("processed")), name="da_state_dirty"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host_id}: dirty={self.dirty} processed={self.processed}"

    @property
    def has_recovery_events(self) -> bool:
        return self.recovery_event_sequence > self.recovery_event_acknowledged
