"""The injectable clock and random source every service reads.

Precedence: a test override installed by :func:`durable_agent.testing.fake_clock` /
``fake_random``, then the ``CLOCK`` / ``RANDOM`` settings, then the wall clock and
:func:`random.random`.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable
from datetime import UTC, datetime

from django.utils import timezone

from durable_agent import conf

_clock_override: Callable[[], datetime] | None = None
_random_override: Callable[[], float] | None = None


def now() -> datetime:
    """Return the current time as an aware UTC datetime."""
    source = _clock_override or conf.clock_callable()
    value = source() if source is not None else timezone.now()
    if value.tzinfo is UTC:  # the wall clock's own (timezone.now()): nothing to convert
        return value
    if timezone.is_naive(value):
        raise ValueError("The configured CLOCK returned a naive datetime")
    return value.astimezone(UTC)


def random() -> float:
    """Return a jitter value in [0, 1)."""
    source = _random_override or conf.random_callable()
    value = source() if source is not None else _random.random()
    if not 0.0 <= value < 1.0:
        raise ValueError(f"The configured RANDOM returned {value!r}, outside [0, 1)")
    return value


def install(
    clock: Callable[[], datetime] | None = None, rng: Callable[[], float] | None = None
) -> tuple[Callable[[], datetime] | None, Callable[[], float] | None]:
    """Install process-wide overrides; return the previous pair (for tests)."""
    global _clock_override, _random_override
    previous = (_clock_override, _random_override)
    _clock_override, _random_override = clock, rng
    return previous
