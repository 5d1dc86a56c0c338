"""Geometry of the dashboard's two SVG charts: plain numbers the template draws, no JS."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from durable_agent.admin import formatting as fmt

PAST_WINDOW_MAX = timedelta(minutes=10)
"""Overdue alarms older than this are drawn clipped at the timeline's left edge."""
FUTURE_WINDOW_MIN = timedelta(minutes=1)
FUTURE_WINDOW_MAX = timedelta(hours=24)
_STEPS_S: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
_STEPS_S += (7200, 10800, 21600, 43200, 86400)
MAX_TICKS = 8


@dataclass(frozen=True)
class Alarm:
    """One armed slot to draw: the host, its page and the slot time."""

    host: str
    url: str
    at: datetime


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Mark:
    host: str
    url: str
    x: float
    y: float
    label_y: float
    when: str
    relative: str
    tone: str  # "overdue", "due" or "upcoming"
    clipped: bool


@dataclass(frozen=True)
class Timeline:
    width: int
    height: int
    left: int
    right: int
    top: int
    axis_y: int
    now_x: float
    ticks: tuple[Tick, ...]
    marks: tuple[Mark, ...]
    beyond: int  # alarms later than the window (not drawn)
    start: datetime
    end: datetime


def _step(span: timedelta) -> int:
    seconds = span.total_seconds()
    for step in _STEPS_S:
        if seconds / step <= MAX_TICKS:
            return step
    return _STEPS_S[-1] * math.ceil(seconds / (_STEPS_S[-1] * MAX_TICKS))


def _tick_label(offset_s: int) -> str:
    if offset_s == 0:
        return "now"
    sign = "+" if offset_s > 0 else "\u2212"
    return sign + fmt.duration(abs(offset_s) * 1000)


def timeline(
    alarms: Sequence[Alarm],
    now: datetime,
    *,
    overdue_after: timedelta,
    width: int = 960,
    row: int = 22,
    left: int = 200,
) -> Timeline:
    """Lay out ``alarms`` (sorted or not) one per row on a time axis around ``now``.

    The window runs from the oldest overdue slot (at most ``PAST_WINDOW_MAX`` back) to the
    latest slot (at least ``FUTURE_WINDOW_MIN``, at most ``FUTURE_WINDOW_MAX`` ahead); slots
    beyond the window are counted in ``beyond`` rather than drawn.
    """
    ordered = sorted(alarms, key=lambda alarm: (alarm.at, alarm.host))
    earliest = ordered[0].at if ordered else now
    past = min(max(now - earliest, timedelta(0)), PAST_WINDOW_MAX)
    latest_in_cap = [a.at for a in ordered if a.at <= now + FUTURE_WINDOW_MAX]
    future = min(
        max((max(latest_in_cap) - now) if latest_in_cap else timedelta(0), FUTURE_WINDOW_MIN),
        FUTURE_WINDOW_MAX,
    )
    # 4% padding on each side so marks at the edges stay visible.
    span = past + future
    start = now - past - span * 0.04
    end = now + future + span * 0.04
    right = width - 24
    plot = right - left

    def x_of(when: datetime) -> float:
        return round(left + plot * ((when - start) / (end - start)), 1)

    drawn = [a for a in ordered if a.at <= end]
    top = 28
    axis_y = top + max(len(drawn), 1) * row + 6
    marks = []
    for index, alarm in enumerate(drawn):
        clipped = alarm.at < start
        late = now - alarm.at
        tone = "overdue" if late > overdue_after else "due" if late >= timedelta(0) else "upcoming"
        y = top + index * row + row / 2
        marks.append(
            Mark(
                host=alarm.host,
                url=alarm.url,
                x=x_of(start) if clipped else x_of(alarm.at),
                y=y,
                label_y=y + 4,
                when=fmt.timestamp(alarm.at),
                relative=fmt.relative(alarm.at, now),
                tone=tone,
                clipped=clipped,
            )
        )
    step = _step(end - start)
    first = math.ceil((start - now).total_seconds() / step)
    last = math.floor((end - now).total_seconds() / step)
    ticks = tuple(
        Tick(x_of(now + timedelta(seconds=k * step)), _tick_label(k * step))
        for k in range(first, last + 1)
    )
    return Timeline(
        width=width,
        height=axis_y + 34,
        left=left,
        right=right,
        top=top,
        axis_y=axis_y,
        now_x=x_of(now),
        ticks=ticks,
        marks=tuple(marks),
        beyond=len(ordered) - len(drawn),
        start=start,
        end=end,
    )


# -- the lateness histogram ---------------------------------------------------------------

# (low, high) in ms, low inclusive, high exclusive; None = unbounded.
LATENESS_BINS: tuple[tuple[int | None, int | None], ...] = (
    (None, 0),
    (0, 100),
    (100, 250),
    (250, 500),
    (500, 1_000),
    (1_000, 2_000),
    (2_000, 5_000),
    (5_000, 10_000),
    (10_000, 30_000),
    (30_000, 60_000),
    (60_000, 300_000),
    (300_000, None),
)


@dataclass(frozen=True)
class Bar:
    label: str
    title: str
    count: int
    x: float
    y: float
    width: float
    height: float
    label_x: float
    count_y: float
    tone: str


@dataclass(frozen=True)
class Histogram:
    width: int
    height: int
    baseline: int
    top: int
    bars: tuple[Bar, ...]
    total: int
    p50: str
    p95: str
    worst: str


def _bin_label(low: int | None, high: int | None) -> str:
    if low is None:
        return "early"
    if high is None:
        return f"\u2265 {fmt.duration(low)}"
    return f"< {fmt.duration(high)}"


def _bin_title(low: int | None, high: int | None) -> str:
    if low is None:
        return "fired before its deadline (lateness < 0)"
    if high is None:
        return f"{fmt.duration(low)} late or more"
    return f"{fmt.duration(low)} to {fmt.duration(high)} late"


def _percentile(values: Sequence[int], fraction: float) -> int:
    ordered = sorted(values)
    rank = max(math.ceil(fraction * len(ordered)) - 1, 0)
    return ordered[rank]


def histogram(
    lateness_ms: Sequence[int], *, width: int = 960, height: int = 240, slow_ms: int = 5_000
) -> Histogram:
    """Bin pass lateness (fired minus due, in ms) into :data:`LATENESS_BINS`."""
    counts = [0] * len(LATENESS_BINS)
    for value in lateness_ms:
        for index, (low, high) in enumerate(LATENESS_BINS):
            if (low is None or value >= low) and (high is None or value < high):
                counts[index] += 1
                break
    top, baseline, left = 24, height - 40, 16
    slot = (width - 2 * left) / len(LATENESS_BINS)
    tallest = max(counts) or 1
    bars = []
    for index, ((low, high), count) in enumerate(zip(LATENESS_BINS, counts, strict=True)):
        bar_height = round((baseline - top) * count / tallest, 1)
        x = round(left + index * slot + slot * 0.12, 1)
        tone = "early" if low is None else "slow" if low >= slow_ms else "ok"
        bars.append(
            Bar(
                label=_bin_label(low, high),
                title=f"{count} passes {_bin_title(low, high)}",
                count=count,
                x=x,
                y=round(baseline - bar_height, 1),
                width=round(slot * 0.76, 1),
                height=bar_height,
                label_x=round(left + index * slot + slot / 2, 1),
                count_y=round(baseline - bar_height - 6, 1),
                tone=tone,
            )
        )
    values = list(lateness_ms)
    return Histogram(
        width=width,
        height=height,
        baseline=baseline,
        top=top,
        bars=tuple(bars),
        total=len(values),
        p50=fmt.duration(_percentile(values, 0.5)) if values else "-",
        p95=fmt.duration(_percentile(values, 0.95)) if values else "-",
        worst=fmt.duration(max(values)) if values else "-",
    )
