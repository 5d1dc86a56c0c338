from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from durable_agent.admin import formatting as fmt
from tests.factories import T0


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (None, "-"),
        (0, "0 ms"),
        (50, "50 ms"),
        (-120, "-120 ms"),
        (1_500, "1.5 s"),
        (10_000, "10 s"),
        (65_000, "1 min 5 s"),
        (60_000, "1 min"),
        (3_600_000, "1 h"),
        (3_725_000, "1 h 2 min"),
        (2 * 86_400_000 + 5, "2 d"),
    ],
)
def test_duration__compact_units(ms: float | None, text: str) -> None:
    assert fmt.duration(ms) == text


def test_timestamp__utc_with_milliseconds_when_present() -> None:
    assert fmt.timestamp(T0) == "2030-01-01 00:00:00 UTC"
    assert fmt.timestamp(T0 + timedelta(milliseconds=50)) == "2030-01-01 00:00:00.050 UTC"
    plus2 = datetime(2030, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))
    assert fmt.timestamp(plus2) == "2030-01-01 00:00:00 UTC"
    assert fmt.timestamp(None) == "-"


def test_relative__past_future_and_now() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert fmt.relative(now + timedelta(seconds=5), now) == "in 5.0 s"
    assert fmt.relative(now - timedelta(minutes=3), now) == "3 min ago"
    assert fmt.relative(now, now) == "now"
    assert fmt.relative(None, now) == ""
