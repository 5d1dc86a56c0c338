"""The retry policy of an agent: ``@durable_agent.agent(..., retry=RetryPolicy(...))``.

What it means at run time is in ``durable_agent/agents/retries.py``. This module imports no
models, so decorating works before the app registry is ready.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from durable_agent.errors import InvalidInput

__all__ = ["MAX_ATTEMPTS", "RetryPolicy"]

MAX_ATTEMPTS = 100
"""The most attempts a policy may allow."""


@dataclass(frozen=True)
class RetryPolicy:
    """Which failures of an agent are retried, how many times, and how long apart.

    Args:
        on: the exception classes retried (subclasses included); default ``(Exception,)``.
        max_attempts: attempts in all, the first included (2 to ``MAX_ATTEMPTS``).
        backoff: seconds before the second attempt; each later wait doubles.
        cap: the longest wait, in seconds.
        jitter: spread each wait uniformly over its upper half (``[b/2, b]``).
    """

    on: tuple[type[BaseException], ...] = (Exception,)
    max_attempts: int = 3
    backoff: float = 1.0
    cap: float = 300.0
    jitter: bool = True

    def __post_init__(self) -> None:
        on = self.on if isinstance(self.on, tuple) else (self.on,)
        if not on or not all(isinstance(c, type) and issubclass(c, Exception) for c in on):
            raise InvalidInput(
                f"RetryPolicy(on=...) takes Exception classes, not {self.on!r}", on=self.on
            )
        object.__setattr__(self, "on", on)
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or not 2 <= self.max_attempts <= MAX_ATTEMPTS
        ):
            raise InvalidInput(
                f"RetryPolicy(max_attempts=...) is an int from 2 to {MAX_ATTEMPTS}, "
                f"not {self.max_attempts!r}",
                max_attempts=self.max_attempts,
            )
        for name in ("backoff", "cap"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
                or value > 86_400
            ):
                raise InvalidInput(
                    f"RetryPolicy({name}=...) is a number of seconds from 0 to 86400, "
                    f"not {value!r}",
                    **{name: value},
                )
        if self.cap < self.backoff:
            raise InvalidInput(
                f"RetryPolicy(cap={self.cap!r}) is shorter than its backoff={self.backoff!r}",
                cap=self.cap,
            )

    def retries(self, failure: BaseException, attempts: int) -> bool:
        """Is ``failure`` of attempt number ``attempts`` retried?"""
        return isinstance(failure, self.on) and attempts < self.max_attempts

    def delay(self, attempts: int, jitter: float) -> timedelta:
        """The wait after attempt number ``attempts`` failed (``jitter`` in ``[0, 1)``)."""
        b = min(float(self.cap), float(self.backoff) * 2.0 ** min(max(attempts - 1, 0), 60))
        seconds = b / 2 + b / 2 * jitter if self.jitter else b
        return timedelta(seconds=seconds)
