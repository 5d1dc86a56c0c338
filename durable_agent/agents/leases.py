"""Submission leases: an attempt owns its head while its lease is live.

A claim is one conditional update (``ready`` -> ``running`` with a fresh owner and expiry), in
its own short transaction; zero rows updated means someone else claimed or settled the row,
and the caller backs off. While the agent runs, a :class:`LeaseKeeper` renews the lease every
``renew_every()`` (from a thread started at the first renewal); an attempt that dies stops
renewing, and recovery takes the submission back once ``lease_expires_at`` has passed.

The lease length and renewal cadence are the ``AGENT_LEASE_TTL_MS`` (30 s) and
``AGENT_LEASE_RENEWAL_MS`` (10 s) settings.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db.models import F

from durable_agent import clock, conf
from durable_agent.models import Submission, SubmissionState
from durable_agent.renewals import renewing

logger = logging.getLogger("durable_agent.agents")


def lease_ttl() -> timedelta:
    """How long a claim or a renewal keeps a submission owned."""
    return conf.agent_lease_ttl()


def renew_every() -> timedelta:
    """How often a running attempt renews its lease."""
    return conf.agent_lease_renewal()


def new_owner() -> str:
    return uuid.uuid4().hex


def claim(submission_id: int, owner: str, now: datetime) -> bool:
    """Claim a ``ready`` submission without an abort intent; False when it is not claimable.

    Resets ``side_effect_marked``: the mark belongs to one attempt. One autocommitted
    ``UPDATE`` (a single statement is atomic on its own: no ``BEGIN`` and ``COMMIT`` round
    trips around it); the caller is never inside a transaction (``process_thread_head``).
    """
    updated = Submission.objects.filter(
        pk=submission_id, state=SubmissionState.READY, abort_requested_at__isnull=True
    ).update(
        state=SubmissionState.RUNNING,
        lease_owner=owner,
        lease_expires_at=now + lease_ttl(),
        attempts=F("attempts") + 1,
        side_effect_marked=False,
        updated_at=now,
    )
    return updated == 1


def renew(submission_id: int, owner: str) -> bool:
    """Push the lease one TTL ahead; False when the attempt no longer owns the submission."""
    now = clock.now()
    updated = Submission.objects.filter(
        pk=submission_id, state=SubmissionState.RUNNING, lease_owner=owner
    ).update(lease_expires_at=now + lease_ttl(), updated_at=now)
    return updated == 1


class LeaseKeeper:
    """Renews one attempt's lease from a daemon thread; ``lost`` is set if renewal fails."""

    def __init__(self, submission_id: int, owner: str) -> None:
        self.submission_id = submission_id
        self.owner = owner
        self.lost = threading.Event()

    def _renew(self) -> bool:
        try:
            if renew(self.submission_id, self.owner):
                return True
            logger.warning(
                "Lease of submission %s was lost while its agent ran",
                self.submission_id,
                extra={"submission_id": self.submission_id},
            )
            self.lost.set()
        except Exception:
            logger.exception(
                "Renewing the lease of submission %s failed",
                self.submission_id,
                extra={"submission_id": self.submission_id},
            )
        return False

    @contextmanager
    def running(self) -> Iterator[LeaseKeeper]:
        """Renew the lease while the block runs (a thread starts only at the first renewal:
        Note [A renewal thread starts only when it is due] in ``durable_agent/renewals.py``)."""
        name = f"da-submission-lease-{self.submission_id}"
        with renewing(name, renew_every().total_seconds(), self._renew):
            yield self
