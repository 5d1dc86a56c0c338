"""Upstream's backoff constants and formulas (docs/pass.md#the-numbers)."""

from __future__ import annotations

import math

from durable_agent import conf

MINIMUM_RETRY_MS = 1_000
MAXIMUM_NO_PROGRESS_REARMS = 8
PARKED_RETRY_MS = 3_600_000
CLAIM_FLOOR_CAP_MS = 60_000
RECOVERY_FAULT_BASE_MS = 5_000
RECOVERY_FAULT_CAP_MS = 60_000
MAX_RETRY_STALLS = 30


def backoff_delay_ms(prior_stalls: int, jitter: float) -> int:
    """``b = min(cap, base * 2^min(stalls, 30))``, jittered uniformly into ``[b/2, b]``."""
    b: int = min(conf.backoff_cap_ms(), conf.backoff_base_ms() * 2 ** min(max(prior_stalls, 0), 30))
    return math.ceil(b / 2 + b / 2 * jitter)


def claim_floor_ms(prior_stalls: int) -> int:
    """The retry floor a claim sets: 1 s, 2 s, 4 s ... 60 s, then parked for 1 h."""
    if min(prior_stalls + 1, MAXIMUM_NO_PROGRESS_REARMS) >= MAXIMUM_NO_PROGRESS_REARMS:
        return PARKED_RETRY_MS
    floor: int = min(CLAIM_FLOOR_CAP_MS, MINIMUM_RETRY_MS * 2**prior_stalls)
    return floor


def recovery_fault_delay_ms(previous_attempts: int) -> int:
    """5 s, 10 s, 20 s, 40 s, 60 s, 60 s ... after the previous attempt count."""
    delay: int = min(
        RECOVERY_FAULT_CAP_MS, RECOVERY_FAULT_BASE_MS * 2 ** min(30, previous_attempts)
    )
    return delay
