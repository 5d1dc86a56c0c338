"""The reference ledger: threads and their FIFO submissions.

Only the reference runtime (``durable_agent.agents``) writes these rows, through its services
and the mutation gate. The maintenance core never reads them: it sees threads and submissions
only as the runtime's string identifiers (``Thread.key`` and ``str(Submission.pk)``).

Note [Ledger lock order]
    A ledger write locks the thread row, then submission rows, and only then (when its
    ``gate.transaction`` flushes) the host's maintenance state row, lanes and schedule row.
    The maintenance pass never holds the state row while it touches ledger rows, so the
    order is the same everywhere.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Length
from django.db.models.lookups import GreaterThanOrEqual, LessThanOrEqual

from durable_agent.models.host import Host

MAX_THREAD_KEY_LENGTH = 256
MAX_IDEMPOTENCY_KEY_LENGTH = 200
MAX_AGENT_NAME_LENGTH = 100
MAX_AGENT_VERSION_LENGTH = 64


class Thread(models.Model):
    """An ordered work stream of one host, named by a caller-chosen ``key``."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="threads")
    key = models.CharField(max_length=MAX_THREAD_KEY_LENGTH)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["host", "key"]
        # The admin's submission search finds a thread by its key alone.
        indexes = [models.Index(fields=["key"], name="da_thread_key")]
        constraints = [
            models.UniqueConstraint(fields=["host", "key"], name="da_thread_one_per_host_key"),
            models.CheckConstraint(
                condition=Q(GreaterThanOrEqual(Length("key"), 1))
                & Q(LessThanOrEqual(Length("key"), MAX_THREAD_KEY_LENGTH)),
                name="da_thread_key_length",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host_id}:{self.key}"


class SubmissionState(models.TextChoices):
    READY = "ready", "ready"
    RUNNING = "running", "running"
    SUSPENDED = "suspended", "suspended (waiting for approval)"
    UNKNOWN = "unknown", "unknown (side effect outcome unknown)"
    SETTLED = "settled", "settled"


class SubmissionOutcome(models.TextChoices):
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    ABORTED = "aborted", "aborted"


class SubmissionQuerySet(models.QuerySet["Submission"]):
    def nonterminal(self) -> SubmissionQuerySet:
        """Every submission that is not settled (served by ``da_submission_nonterminal``)."""
        return self.exclude(state=SubmissionState.SETTLED)

    def settled(self) -> SubmissionQuerySet:
        return self.filter(state=SubmissionState.SETTLED)

    def abort_requested(self) -> SubmissionQuerySet:
        """Ready submissions with an accepted abort: recovery settles them ``aborted``."""
        return self.filter(state=SubmissionState.READY, abort_requested_at__isnull=False)


class Submission(models.Model):
    """One accepted input on a thread; FIFO per thread by ``sequence``.

    ``host`` repeats ``thread.host`` so that one partial index serves "the nonterminal
    submissions of a host, FIFO per thread" (the pass reads it on every actionable pass);
    the services always copy it from the thread.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="submissions")
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="submissions")
    sequence = models.BigIntegerField(help_text="FIFO position in the thread, from 1.")
    agent = models.CharField(max_length=MAX_AGENT_NAME_LENGTH)
    agent_version = models.CharField(max_length=MAX_AGENT_VERSION_LENGTH)
    payload = models.JSONField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=MAX_IDEMPOTENCY_KEY_LENGTH)
    state = models.CharField(
        max_length=16, choices=SubmissionState.choices, default=SubmissionState.READY
    )
    outcome = models.CharField(
        max_length=16, choices=SubmissionOutcome.choices, null=True, blank=True
    )
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    lease_owner = models.CharField(max_length=64, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0, help_text="Claims so far.")
    side_effect_marked = models.BooleanField(
        default=False, help_text="The current attempt started a side effect."
    )
    not_before = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The agent does not start before this time: a delayed submission, or the "
        "next try of a retried one (docs/first-agent.md).",
    )
    abort_requested_at = models.DateTimeField(null=True, blank=True)
    approval_reason = models.TextField(null=True, blank=True)
    approved_at = models.DateTimeField(null=True, blank=True, help_text="The last approval.")
    approvals = models.JSONField(
        default=list, blank=True, help_text="Every approval reason an operator approved."
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    settled_at = models.DateTimeField(null=True, blank=True)

    objects = SubmissionQuerySet.as_manager()

    class Meta:
        ordering = ["thread", "sequence"]
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "sequence"], name="da_submission_one_per_sequence"
            ),
            models.UniqueConstraint(
                fields=["thread", "idempotency_key"], name="da_submission_idempotency_key_unique"
            ),
            models.CheckConstraint(
                condition=Q(sequence__gte=1), name="da_submission_sequence_positive"
            ),
            models.CheckConstraint(
                condition=Q(attempts__gte=0), name="da_submission_attempts_nonnegative"
            ),
            models.CheckConstraint(
                condition=Q(state__in=SubmissionState.values), name="da_submission_state_valid"
            ),
            models.CheckConstraint(
                condition=(
                    Q(
                        state=SubmissionState.SETTLED,
                        outcome__in=SubmissionOutcome.values,
                        settled_at__isnull=False,
                    )
                    | (
                        ~Q(state=SubmissionState.SETTLED)
                        & Q(outcome__isnull=True, settled_at__isnull=True)
                    )
                ),
                name="da_submission_outcome_iff_settled",
            ),
            models.CheckConstraint(
                condition=(
                    Q(
                        state=SubmissionState.RUNNING,
                        lease_owner__isnull=False,
                        lease_expires_at__isnull=False,
                    )
                    | (
                        ~Q(state=SubmissionState.RUNNING)
                        & Q(lease_owner__isnull=True, lease_expires_at__isnull=True)
                    )
                ),
                name="da_submission_lease_iff_running",
            ),
            models.CheckConstraint(
                condition=~Q(state=SubmissionState.SUSPENDED) | Q(approval_reason__isnull=False),
                name="da_submission_suspended_has_reason",
            ),
            models.CheckConstraint(
                condition=Q(GreaterThanOrEqual(Length("idempotency_key"), 1)),
                name="da_submission_idempotency_key_not_empty",
            ),
            models.CheckConstraint(
                condition=Q(GreaterThanOrEqual(Length("agent"), 1))
                & Q(GreaterThanOrEqual(Length("agent_version"), 1)),
                name="da_submission_agent_not_empty",
            ),
        ]
        indexes = [
            models.Index(
                fields=["host", "thread", "sequence"],
                condition=~Q(state="settled"),
                name="da_submission_nonterminal",
            ),
            # The admin's submission list: its ordering, its idempotency-key search, and the
            # retention of settled submissions (oldest first).
            models.Index(fields=["-updated_at", "-id"], name="da_submission_updated"),
            models.Index(fields=["idempotency_key"], name="da_submission_idempotency"),
            models.Index(
                fields=["settled_at"],
                condition=Q(state="settled"),
                name="da_submission_settled",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.thread_id}#{self.sequence} {self.state}"
