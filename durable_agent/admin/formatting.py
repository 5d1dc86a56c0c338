"""How the admin shows times and durations: UTC, millisecond precision, relative to the clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from durable_agent.text import duration

__all__ = ["duration", "duration_between", "timestamp"]


def duration_between(later: datetime, earlier: datetime) -> str:
    return duration((later - earlier) / timedelta(milliseconds=1))


def timestamp(value: datetime | None) -> str:
    """``2030-01-01 00:00:05 UTC`` (milliseconds shown when there are any)."""
    if value is None:
        return "-"
    value = value.astimezone(UTC)
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond // 1000:03d}"
    return text + " UTC"


def relative(value: datetime | None, now: datetime) -> str:
    """``"in 5.0 s"``, ``"3 min ago"`` or ``"now"``."""
    if value is None:
        return ""
    delta_ms = (value - now) / timedelta(milliseconds=1)
    if abs(delta_ms) < 1:
        return "now"
    if delta_ms > 0:
        return f"in {duration(delta_ms)}"
    return f"{duration(-delta_ms)} ago"
