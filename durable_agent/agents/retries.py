"""Automatic retries of failed attempts: ``@durable_agent.agent(..., retry=RetryPolicy(...))``.

When an attempt raises an exception the agent's policy names, and the submission has had fewer
than ``max_attempts`` attempts, the attempt's settlement writes the submission back to
``ready`` with ``not_before`` at the next try and the attempt's error in ``error``, in the same
commit that would have settled it ``failed``. The next try waits in the due queue like any
delayed submission (Note [Delayed heads] in
``durable_agent/maintenance/passes/native.py``): durable across restarts, with no
worker sleeping. The delay before try ``n + 1`` is ``min(cap, backoff * 2 ** (n - 1))``
seconds, jittered uniformly into its upper half through the injectable RNG
(``durable_agent.clock.random``).

Never retried automatically: an attempt that asked for approval, an aborted submission, an
exception the policy does not name, an interruption that is not an ``Exception``, and an
``unknown`` outcome (a worker died after a side effect: only an operator knows whether to run
it again, with ``resolve_unknown(..., outcome="retry")``).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from durable_agent import clock
from durable_agent.agents import registry
from durable_agent.agents.retry_policy import RetryPolicy
from durable_agent.models import Host, Submission, SubmissionState
from durable_agent.observability import log_extra

__all__ = ["RetryPolicy", "next_try", "retry"]

logger = logging.getLogger("durable_agent.agents")


def next_try(
    policy: RetryPolicy | None, failure: BaseException | None, attempts: int, now: datetime
) -> datetime | None:
    """When the failed attempt number ``attempts`` runs again, or None (it settles failed)."""
    if policy is None or failure is None or not policy.retries(failure, attempts):
        return None
    return now + policy.delay(attempts, clock.random())


def waiting_fields(error: dict[str, Any] | None, at: datetime, now: datetime) -> dict[str, Any]:
    """Fields of a submission whose failed attempt will run again at ``at``."""
    return {
        "state": SubmissionState.READY,
        "error": error,
        "not_before": at,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": now,
    }


def retry(
    host: Host,
    row: Submission,
    owner: str,
    failure: BaseException | None,
    error: dict[str, Any] | None,
    now: datetime,
) -> bool:
    """Inside the settlement's ``gate.transaction``: write the failed attempt of ``row`` (still
    leased by ``owner``) back to ``ready`` for its next try when its agent's policy retries
    ``failure``; False (nothing written) when the attempt settles instead."""
    spec = registry.lookup(row.agent, row.agent_version)
    at = next_try(None if spec is None else spec.retry, failure, row.attempts, now)
    if at is None:
        return False
    Submission.objects.filter(pk=row.pk, lease_owner=owner).update(**waiting_fields(error, at, now))
    logger.info(
        "Attempt %s of submission %s (agent %s@%s) failed; retrying at %s",
        row.attempts,
        row.pk,
        row.agent,
        row.agent_version,
        at.isoformat(),
        extra=log_extra(host, submission_id=row.pk, action="agent_retry"),
    )
    return True
