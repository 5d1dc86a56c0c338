"""How the admin shows times and durations: UTC, millisecond precision, relative to the clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000))


def duration(ms: float | int | None) -> str:
    """A compact duration: ``"350 ms"``, ``"4.2 s"``, ``"3 min 5 s"``, ``"2 h 5 min"``."""
    if ms is None:
        return "-"
    sign = "-" if ms < 0 else ""
    value = abs(float(ms))
    if value < 1_000:
        return f"{sign}{value:.0f} ms"
    if value < 10_000:
        return f"{sign}{value / 1_000:.1f} s"
    parts: list[str] = []
    rest = int(value)
    for unit, size in _UNITS:
        count, rest = divmod(rest, size)
        if count or parts:
            parts.append(f"{count} {unit}")
        if len(parts) == 2:
            break
    parts = [part for part in parts if not part.startswith("0 ")] or parts[:1]
    return sign + " ".join(parts)


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
