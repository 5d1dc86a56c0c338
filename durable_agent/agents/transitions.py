"""The submission state machine, as field values for conditional updates.

::

    ready ──claim──► running ──settle──► settled (completed | failed | aborted)
      ▲                │  │
      │ lease expired, │  └─suspend_for_approval──► suspended ──approve──► ready
      │ retry-safe or  │                                 └──reject / abort──► settled
      │ no side effect │
      └────────────────┴─lease expired after a side effect──► unknown ──resolve_unknown──►
                                                              settled | ready (retry)
                                                              (abort: settled / aborted)

``abort()`` settles a ``ready``, ``suspended`` or ``unknown`` submission ``aborted`` at once;
a ``running`` one gets an abort intent, sees ``ctx.cancelled()`` and settles ``aborted`` when
its agent returns (or, if its worker died, when recovery finds the expired lease). ``abort()`` never
leaves a ``ready`` row with an intent, but recovery still settles one it finds (the protocol's
``SettleAborted`` path), so no producer can make such a row run.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from durable_agent.errors import error_message, type_name
from durable_agent.models import SubmissionOutcome, SubmissionState
from durable_agent.text import storable

#: The longest ``message`` a failed submission's ``error`` keeps.
MAX_ERROR_MESSAGE_LENGTH = 2000
#: The longest ``type`` a failed submission's ``error`` keeps.
MAX_ERROR_TYPE_LENGTH = 200


def settled(
    outcome: SubmissionOutcome,
    now: datetime,
    *,
    result: Any = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fields of a settlement (the lease, if any, is released)."""
    return {
        "state": SubmissionState.SETTLED,
        "outcome": outcome,
        "result": result,
        "error": error,
        "lease_owner": None,
        "lease_expires_at": None,
        "settled_at": now,
        "updated_at": now,
    }


def ready(now: datetime) -> dict[str, Any]:
    """Fields of a submission handed back to the queue (its lease, if any, released)."""
    return {
        "state": SubmissionState.READY,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": now,
    }


def unknown(now: datetime) -> dict[str, Any]:
    """Fields of an attempt that died after marking a side effect (not retry-safe)."""
    return {
        "state": SubmissionState.UNKNOWN,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": now,
    }


def suspended(reason: str, now: datetime) -> dict[str, Any]:
    """Fields of an attempt that asked for approval: a stable wait."""
    return {
        "state": SubmissionState.SUSPENDED,
        "approval_reason": reason,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": now,
    }


def error_of(exc: BaseException) -> dict[str, Any]:
    """The ``error`` of an agent that raised: its type and message (no traceback), storable
    whatever the agent raised (Note [Storable text] in ``durable_agent/text.py``)."""
    return {
        "type": storable(type_name(exc), limit=MAX_ERROR_TYPE_LENGTH),
        "message": storable(error_message(exc), limit=MAX_ERROR_MESSAGE_LENGTH),
    }
