"""Upstream's backoff constants and formulas (docs/pass.md, failures and backoff)."""

from __future__ import annotations

import pytest

from durable_agent.maintenance import backoff


def test_constants__match_upstream() -> None:
    # Reference 2.2: MinimumRetryMillis, MaximumNoProgressRearms, ParkedRetryMillis.
    assert backoff.MINIMUM_RETRY_MS == 1_000
    assert backoff.MAXIMUM_NO_PROGRESS_REARMS == 8
    assert backoff.PARKED_RETRY_MS == 3_600_000


@pytest.mark.parametrize(
    ("prior_stalls", "expected_ms"),
    [
        (0, 1_000),
        (1, 2_000),
        (2, 4_000),
        (3, 8_000),
        (4, 16_000),
        (5, 32_000),
        (6, 60_000),  # 64 s capped at 60 s
        (7, 3_600_000),  # the eighth claim without progress parks the lane for 1 h
        (8, 3_600_000),  # stalls saturate at 8: still parked
    ],
)
def test_claim_floor_ms__doubles_from_one_second_caps_at_sixty_then_parks(
    prior_stalls: int, expected_ms: int
) -> None:
    assert backoff.claim_floor_ms(prior_stalls) == expected_ms


@pytest.mark.parametrize(
    ("prior_stalls", "jitter", "expected_ms"),
    [
        (0, 0.0, 50),  # b = 100: [50, 100]
        (0, 0.5, 75),
        (0, 0.999999, 100),
        (1, 0.0, 100),  # b = 200
        (5, 0.0, 1_600),  # b = 3200
        (6, 0.0, 2_500),  # b = min(5000, 6400)
        (6, 0.999999, 5_000),
        (30, 0.0, 2_500),
        (1_000, 0.0, 2_500),  # the exponent is clamped to 30
    ],
)
def test_backoff_delay_ms__is_uniform_over_half_b_to_b_with_default_settings(
    prior_stalls: int, jitter: float, expected_ms: int
) -> None:
    assert backoff.backoff_delay_ms(prior_stalls, jitter) == expected_ms


def test_backoff_delay_ms__rounds_up_and_reads_settings_at_call_time(settings) -> None:
    # Upstream's test fixture config: alarmBackoffBase=10, alarmBackoffCap=100.
    settings.DURABLE_AGENT = {"ALARM_BACKOFF_BASE_MS": 10, "ALARM_BACKOFF_CAP_MS": 100}
    assert backoff.backoff_delay_ms(0, 0.0) == 5
    assert backoff.backoff_delay_ms(3, 0.0) == 40
    assert backoff.backoff_delay_ms(4, 0.0) == 50  # min(100, 160)
    settings.DURABLE_AGENT = {"ALARM_BACKOFF_BASE_MS": 3, "ALARM_BACKOFF_CAP_MS": 100}
    assert backoff.backoff_delay_ms(0, 0.0) == 2  # ceil(1.5)
    assert backoff.backoff_delay_ms(0, 0.1) == 2  # ceil(1.65)


@pytest.mark.parametrize(
    ("previous_attempts", "expected_ms"),
    [(0, 5_000), (1, 10_000), (2, 20_000), (3, 40_000), (4, 60_000), (5, 60_000), (99, 60_000)],
)
def test_recovery_fault_delay_ms__is_five_ten_twenty_forty_then_sixty_seconds(
    previous_attempts: int, expected_ms: int
) -> None:
    assert backoff.recovery_fault_delay_ms(previous_attempts) == expected_ms
