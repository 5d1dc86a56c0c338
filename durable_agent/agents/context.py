"""What an agent function receives: ``fn(ctx, payload)``."""

from __future__ import annotations

import threading
from datetime import datetime

from django.db import transaction

from durable_agent import clock
from durable_agent.agents.errors import LeaseLost, TransactionMisuse
from durable_agent.errors import InvalidInput
from durable_agent.maintenance.store.transactions import user_atomic_depth
from durable_agent.models import Submission, SubmissionState
from durable_agent.text import check_text

MAX_APPROVAL_REASON_LENGTH = 2000


class ApprovalRequested(BaseException):
    """Raised by ``ctx.suspend_for_approval``; the runtime catches it and suspends.

    It derives from ``BaseException`` so that an agent's ``except Exception`` cannot swallow
    the suspension by accident.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AgentContext:
    """The context of one attempt.

    Attributes:
        submission: the claimed ``Submission`` row (as it was when the attempt claimed it).
        deadline: the pass's yield deadline; a long agent should finish, or checkpoint its
            own progress, by then.
    """

    def __init__(
        self, submission: Submission, deadline: datetime, owner: str, lost: threading.Event
    ) -> None:
        self.submission = submission
        self.deadline = deadline
        self._owner = owner
        self._lost = lost

    @property
    def thread(self) -> str:
        """The key of the submission's thread."""
        return str(self.submission.thread.key)

    @property
    def attempt(self) -> int:
        """1 for the first attempt, 2 after one retry, ..."""
        return int(self.submission.attempts)

    @property
    def approved(self) -> bool:
        """True when an operator approved the submission's last approval request."""
        reason = self.submission.approval_reason
        return reason is not None and reason in self.submission.approvals

    @property
    def approval_reason(self) -> str | None:
        """The reason of the last approval request, if any."""
        return self.submission.approval_reason

    def now(self) -> datetime:
        """The current time (the injectable clock)."""
        return clock.now()

    def cancelled(self) -> bool:
        """True once an abort was requested or this attempt lost its lease.

        Each call reads the submission's row (one primary-key query): call it between steps,
        not in a tight loop. A cancelled agent should return (or raise) soon; the submission
        then settles ``aborted``.
        """
        if self._lost.is_set():
            return True
        row = (
            Submission.objects.filter(pk=self.submission.pk)
            .values_list("abort_requested_at", "lease_owner")
            .first()
        )
        return row is None or row[0] is not None or row[1] != self._owner

    def suspend_for_approval(self, reason: str) -> None:
        """Stop here until an operator approves ``reason``; returns at once once approved.

        Raises the control-flow exception :class:`ApprovalRequested`: the runtime suspends the
        submission with ``reason`` (a stable wait, no alarm). ``approve()`` makes it ``ready``
        again and the agent runs from the start; this call then returns, because ``reason``
        is now among the submission's approvals. Another reason asks again, so an agent can
        request several approvals in turn (use a reason that names what is approved).
        """
        if not isinstance(reason, str) or not 1 <= len(reason) <= MAX_APPROVAL_REASON_LENGTH:
            raise InvalidInput(
                f"An approval reason is a string of 1 to {MAX_APPROVAL_REASON_LENGTH} characters",
                reason=reason,
            )
        check_text(reason, what="approval reason")
        if reason in self.submission.approvals:
            return
        raise ApprovalRequested(reason)

    def mark_side_effect(self) -> None:
        """Record, durably and at once, that this attempt is starting a side effect.

        Call it right before the first call that changes the outside world. If the attempt
        then dies, recovery cannot tell whether the effect happened: the submission becomes
        ``unknown`` for an operator to resolve, unless the agent is ``retry_safe`` (then it
        simply runs again).

        Raises:
            TransactionMisuse: called inside ``transaction.atomic`` (the mark must commit
                before the side effect starts).
            LeaseLost: the attempt no longer owns the submission; do not start the effect.
        """
        if user_atomic_depth() > 0:
            raise TransactionMisuse(
                "mark_side_effect() must run outside transaction.atomic so that the mark "
                "commits before the side effect starts"
            )
        with transaction.atomic():
            updated = Submission.objects.filter(
                pk=self.submission.pk, state=SubmissionState.RUNNING, lease_owner=self._owner
            ).update(side_effect_marked=True, updated_at=clock.now())
        if updated != 1:
            self._lost.set()
            raise LeaseLost(submission=str(self.submission.pk))
        self.submission.side_effect_marked = True
