"""Settings are read at call time and validated by system checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from durable_agent import clock, conf
from durable_agent.checks import check_settings
from durable_agent.testing import FakeClock, fake_clock, fake_random

Q_OK = {"orm": "default", "timeout": 60, "retry": 90}


def ids(**settings: object) -> list[str]:
    with override_settings(**settings):
        return [message.id for message in check_settings()]


def fixed_now() -> datetime:
    return datetime(2031, 5, 6, tzinfo=UTC)


def test_checks__defaults_are_clean() -> None:
    assert ids(DURABLE_AGENT={}, Q_CLUSTER=Q_OK) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([], "durable_agent.E001"),
        ({"NOPE": 1}, "durable_agent.E002"),
        ({"ALARM_BACKOFF_BASE_MS": "100"}, "durable_agent.E003"),
        ({"ALARM_BACKOFF_BASE_MS": True}, "durable_agent.E003"),
        ({"ALARM_BACKOFF_BASE_MS": 0}, "durable_agent.E004"),
        ({"MUTATION_TICKET_TTL_MS": 10}, "durable_agent.E004"),
        ({"CLOCK": "no.such.module.now"}, "durable_agent.E005"),
        ({"RANDOM": "durable_agent.conf.SETTINGS"}, "durable_agent.E006"),
        ({"ALARM_BACKOFF_BASE_MS": 500, "ALARM_BACKOFF_CAP_MS": 100}, "durable_agent.E007"),
    ],
)
def test_checks__invalid_settings(value: object, expected: str) -> None:
    assert expected in ids(DURABLE_AGENT=value, Q_CLUSTER=Q_OK)


@pytest.mark.parametrize(
    ("cluster", "expected"),
    [
        (None, "durable_agent.W001"),
        ({**Q_OK, "orm": "other"}, "durable_agent.W002"),
        ({"orm": "default", "timeout": 90, "retry": 60}, "durable_agent.W003"),
        ({"orm": "default"}, "durable_agent.W003"),
    ],
)
def test_checks__q_cluster(cluster: object, expected: str) -> None:
    assert expected in ids(DURABLE_AGENT={}, Q_CLUSTER=cluster)


def test_conf__read_at_call_time() -> None:
    assert conf.minimum_alarm_delay_ms() == 50
    with override_settings(DURABLE_AGENT={"ALARM_BACKOFF_BASE_MS": 11}):
        assert conf.minimum_alarm_delay_ms() == 6
        assert conf.minimum_alarm_delay() == timedelta(milliseconds=6)
    assert conf.minimum_alarm_delay_ms() == 50


def test_clock__setting_and_override_precedence() -> None:
    with override_settings(DURABLE_AGENT={"CLOCK": "tests.test_checks.fixed_now"}):
        assert clock.now() == fixed_now()
        with fake_clock(datetime(2040, 1, 1, tzinfo=UTC)) as fake:
            assert clock.now() == fake.now()
        assert clock.now() == fixed_now()


def test_fake_clock__advances_and_never_goes_back() -> None:
    fake = FakeClock(datetime(2030, 1, 1, tzinfo=UTC))
    assert fake.advance(ms=1500) == datetime(2030, 1, 1, 0, 0, 1, 500_000, tzinfo=UTC)
    with pytest.raises(ValueError, match="only moves forward"):
        fake.advance(ms=-1)
    with pytest.raises(ValueError, match="only moves forward"):
        fake.set(datetime(2029, 1, 1, tzinfo=UTC))
    with pytest.raises(ValueError, match="aware"):
        FakeClock(datetime(2030, 1, 1))


def test_fake_random__sequence_then_repeat() -> None:
    with fake_random([0.25, 0.5]):
        assert [clock.random() for _ in range(3)] == [0.25, 0.5, 0.5]
    with fake_random(1.0), pytest.raises(ValueError, match="outside"):
        clock.random()


def test_clock__naive_configured_clock_is_refused() -> None:
    with fake_clock() as fake:
        fake._now = fake._now.replace(tzinfo=None)
        with pytest.raises(ValueError, match="naive"):
            clock.now()


def test_recommended_q_cluster__overrides_and_removals() -> None:
    cluster = conf.recommended_q_cluster(workers=4, bulk=None)
    assert cluster["broker_class"] == "durable_agent.broker.AlarmBroker"
    assert cluster["timeout"] < cluster["retry"]
    assert cluster["workers"] == 4
    assert "bulk" not in cluster
    assert conf.recommended_q_cluster() == dict(conf.RECOMMENDED_Q_CLUSTER)
    with override_settings(Q_CLUSTER=conf.recommended_q_cluster()):
        assert [m.id for m in check_settings()] == []


def test_recommended_database__sqlite_and_postgresql() -> None:
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x", "OPTIONS": {"timeout": 5}}
    assert conf.recommended_database(sqlite) == {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": "x",
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 5},
        "CONN_MAX_AGE": 600,
        "CONN_HEALTH_CHECKS": True,
    }
    assert sqlite["OPTIONS"] == {"timeout": 5}  # a copy
    postgres = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}
    assert conf.recommended_database(postgres, CONN_MAX_AGE=0) == {
        **postgres,
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": True,
    }
