"""Delayed work: the ``not_before`` of ``submit`` (docs/first-agent.md#retries-delays-and-waiting).

A delayed submission is admitted at once (its idempotency key and its place on the thread are
taken at submit time) and its agent starts no sooner than ``not_before``. The submissions
behind it on its thread wait with it: a thread stays FIFO (Note [Delayed heads] in
``durable_agent/maintenance/passes/native.py``). Submit independent delayed work on
its own thread.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone

from durable_agent.errors import InvalidDeadline, InvalidInput

__all__ = ["MAX_DELAY", "resolve_not_before"]

MAX_DELAY = timedelta(days=366)
"""The furthest ahead a submission may be delayed (from the time it is submitted)."""


def resolve_not_before(value: object, now: datetime) -> datetime | None:
    """The aware UTC time a submission may start at, from ``submit``'s ``not_before``.

    ``None``: at once. A ``timedelta``: that long after ``now`` (zero or more). An aware
    ``datetime``: that time (a past time means at once). At most ``MAX_DELAY`` after ``now``.

    Raises:
        InvalidDeadline: a naive datetime.
        InvalidInput: another type, a negative timedelta, or more than ``MAX_DELAY`` ahead.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise InvalidInput(
                f"not_before must not be a negative timedelta, not {value!r}", not_before=value
            )
        at = now + value
    elif isinstance(value, datetime):
        if timezone.is_naive(value):
            raise InvalidDeadline(
                "not_before must be an aware datetime (or a timedelta from now); "
                f"{value.isoformat()} has no time zone",
                not_before=value,
            )
        at = value.astimezone(UTC)
    else:
        raise InvalidInput(
            f"not_before is an aware datetime, a timedelta or None, not {type(value).__name__}",
            not_before=value,
        )
    if at - now > MAX_DELAY:
        raise InvalidInput(
            f"not_before may be at most {MAX_DELAY.days} days ahead; {at.isoformat()} is later",
            not_before=value,
            limit_days=MAX_DELAY.days,
        )
    return at
