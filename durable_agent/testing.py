"""Helpers for tests of durable_agent and of the projects that use it.

``fake_clock`` pins the time every service reads (gate, pass, alarm, runtime leases), so tests
never sleep; ``fake_random`` pins the backoff jitter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from durable_agent import clock as _clock

__all__ = ["FakeClock", "FakeRandom", "fake_clock", "fake_random"]


class FakeClock:
    """A manually advanced clock. Thread-safe: passes may read it from worker threads."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2030, 1, 1, tzinfo=UTC)
        if timezone.is_naive(start):
            raise ValueError("FakeClock needs an aware start datetime")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        return self.now()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, *, ms: float = 0, seconds: float = 0, minutes: float = 0) -> datetime:
        """Move the clock forward and return the new time."""
        delta = timedelta(milliseconds=ms, seconds=seconds, minutes=minutes)
        if delta < timedelta(0):
            raise ValueError("A FakeClock only moves forward")
        with self._lock:
            self._now += delta
            return self._now

    def set(self, when: datetime) -> datetime:
        """Jump to ``when`` (not earlier than now)."""
        with self._lock:
            if when < self._now:
                raise ValueError("A FakeClock only moves forward")
            self._now = when.astimezone(UTC)
            return self._now


class FakeRandom:
    """Returns the given values in turn (the last one repeats)."""

    def __init__(self, values: Iterable[float] = (0.0,)) -> None:
        self._values = list(values) or [0.0]
        self._index = 0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            value = self._values[min(self._index, len(self._values) - 1)]
            self._index += 1
            return value


@contextmanager
def fake_clock(start: datetime | None = None) -> Iterator[FakeClock]:
    """Install a :class:`FakeClock` for every service until the block exits."""
    fake = FakeClock(start)
    previous_clock, previous_rng = _clock.install(fake, _clock._random_override)
    try:
        yield fake
    finally:
        _clock.install(previous_clock, _clock._random_override)
        del previous_rng


@contextmanager
def fake_random(values: Iterable[float] | float = 0.0) -> Iterator[Callable[[], float]]:
    """Pin the jitter source: a constant or a sequence of values in [0, 1)."""
    rng = FakeRandom([values] if isinstance(values, (int, float)) else values)
    previous_clock, previous_rng = _clock.install(_clock._clock_override, rng)
    try:
        yield rng
    finally:
        _clock.install(_clock._clock_override, previous_rng)
        del previous_clock
