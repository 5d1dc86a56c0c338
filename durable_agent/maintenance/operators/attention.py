"""Work that waits for a person: what ``maintenance_audit``, the health endpoint, the
django-health-check backend and the metrics report as *attention* (docs/operations.md).

* ``unknown`` submissions: a worker died after a side effect; resolve or abort them.
* ``suspended`` submissions: their agent asked for approval; approve or reject them.
* ``binding_waits``: heads parked because their agent version is not registered where the pass
  ran (deploy it, restart the cluster, or retry them).
* ``failing_hosts``: hosts whose last ``FAILING_AFTER_PASSES`` passes failed.

None of these breaks the alarm invariant (they are stable waits, or a failure the pass backs
off from), so they make the fleet *degraded*, not down. Each new unknown, suspended or parked
submission is also logged at WARNING and sent as the ``submission_needs_operator`` signal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.db.models import Count, Q

from durable_agent.maintenance.store import selectors
from durable_agent.models import BindingRetry, Host, Submission, SubmissionState

__all__ = ["Attention", "attention"]


@dataclass(frozen=True)
class Attention:
    """Counts of the work that waits for a person, across hosts."""

    unknown: int = 0
    suspended: int = 0
    binding_waits: int = 0
    failing_hosts: int = 0

    @property
    def total(self) -> int:
        return self.unknown + self.suspended + self.binding_waits + self.failing_hosts

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}

    def describe(self) -> str:
        """One line for people, e.g. ``2 unknown submission(s), 1 failing host(s)``."""
        parts = [
            (self.unknown, "unknown submission(s) to resolve"),
            (self.suspended, "suspended submission(s) waiting for approval"),
            (self.binding_waits, "submission(s) parked on a missing agent binding"),
            (self.failing_hosts, "failing host(s)"),
        ]
        return ", ".join(f"{n} {what}" for n, what in parts if n) or "nothing"


def attention(*, failing_hosts: int | None = None) -> Attention:
    """Read the counts (three queries; ``failing_hosts`` given by a caller that has it)."""
    owed = Submission.objects.filter(
        state__in=[SubmissionState.SUSPENDED, SubmissionState.UNKNOWN]
    ).aggregate(
        suspended=Count("pk", filter=Q(state=SubmissionState.SUSPENDED)),
        unknown=Count("pk", filter=Q(state=SubmissionState.UNKNOWN)),
    )
    if failing_hosts is None:
        failing_hosts = (
            Host.objects.annotate(failed_passes=selectors.failure_streak())
            .filter(selectors.failing())
            .count()
        )
    return Attention(
        unknown=int(owed["unknown"] or 0),
        suspended=int(owed["suspended"] or 0),
        binding_waits=BindingRetry.objects.count(),
        failing_hosts=failing_hosts,
    )
