from __future__ import annotations

from datetime import timedelta

import pytest

from durable_agent.admin import charts
from durable_agent.admin import formatting as fmt
from tests.factories import T0

OVERDUE = timedelta(seconds=60)


def _alarm(name: str, **delta: float) -> charts.Alarm:
    return charts.Alarm(name, f"/{name}/", T0 + timedelta(**delta))


def test_timeline__rows_in_time_order_with_now_inside() -> None:
    t = charts.timeline(
        [_alarm("b", minutes=5), _alarm("a", seconds=-90), _alarm("c", seconds=-10)],
        T0,
        overdue_after=OVERDUE,
    )
    assert [m.host for m in t.marks] == ["a", "c", "b"]
    assert [m.tone for m in t.marks] == ["overdue", "due", "upcoming"]
    xs = [m.x for m in t.marks]
    assert t.left < xs[0] < xs[1] < t.now_x < xs[2] < t.right
    assert [m.y for m in t.marks] == sorted(m.y for m in t.marks)
    assert any(tick.label == "now" and tick.x == t.now_x for tick in t.ticks)
    assert 2 <= len(t.ticks) <= charts.MAX_TICKS + 1
    assert t.axis_y > t.marks[-1].y
    assert t.beyond == 0


def test_timeline__clips_old_overdue_slots_and_counts_far_ones() -> None:
    t = charts.timeline(
        [_alarm("ancient", hours=-3), _alarm("soon", seconds=30), _alarm("far", days=3)],
        T0,
        overdue_after=OVERDUE,
    )
    ancient = t.marks[0]
    assert ancient.clipped
    assert ancient.x == t.left
    assert [m.host for m in t.marks] == ["ancient", "soon"]
    assert t.beyond == 1
    assert t.start >= T0 - charts.PAST_WINDOW_MAX * 1.1


def test_timeline__empty_and_single() -> None:
    empty = charts.timeline([], T0, overdue_after=OVERDUE)
    assert empty.marks == ()
    assert empty.ticks
    single = charts.timeline([_alarm("x", milliseconds=50)], T0, overdue_after=OVERDUE)
    assert single.marks[0].x > single.now_x
    assert single.end - T0 >= charts.FUTURE_WINDOW_MIN


@pytest.mark.parametrize(
    ("span", "step"),
    [(timedelta(seconds=5), 1), (timedelta(minutes=1), 10), (timedelta(hours=1), 600)],
)
def test_timeline__tick_steps(span: timedelta, step: int) -> None:
    assert charts._step(span) == step


def test_histogram__bins_percentiles_and_heights() -> None:
    h = charts.histogram([-3, 0, 99, 100, 250, 999, 1000, 4999, 5000, 60_000, 300_000, 10**7])
    assert [b.count for b in h.bars] == [1, 2, 1, 1, 1, 1, 1, 1, 0, 0, 1, 2]
    assert h.total == 12
    assert h.p50 == fmt.duration(999)
    assert h.worst == fmt.duration(10**7)
    tallest = max(h.bars, key=lambda b: b.height)
    assert tallest.height == h.baseline - h.top
    assert tallest.y == h.top
    empty_bar = h.bars[8]
    assert (empty_bar.height, empty_bar.y) == (0, h.baseline)
    assert [b.tone for b in h.bars][:2] == ["early", "ok"]
    assert h.bars[-1].tone == "slow"
    assert h.bars[0].label == "early"
    assert h.bars[-1].label.startswith("\u2265 5 min")


def test_histogram__empty() -> None:
    h = charts.histogram([])
    assert h.total == 0
    assert all(b.count == 0 and b.height == 0 for b in h.bars)
    assert (h.p50, h.p95, h.worst) == ("-", "-", "-")
