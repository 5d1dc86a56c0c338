"""Settings are read at call time and validated by system checks."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.test import override_settings

from durable_agent import clock, conf
from durable_agent.checks import check_project, check_settings
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
        ({"API_AUTH_FAILURES_PER_MINUTE": -1}, "durable_agent.E004"),
        ({"API_AUTH_FAILURES_PER_MINUTE": "20/m"}, "durable_agent.E003"),
        ({"CLOCK": "no.such.module.now"}, "durable_agent.E005"),
        ({"RANDOM": "durable_agent.conf.SETTINGS"}, "durable_agent.E006"),
        ({"ALARM_BACKOFF_BASE_MS": 500, "ALARM_BACKOFF_CAP_MS": 100}, "durable_agent.E007"),
        ({"RECOVERY_TIMEOUT_MS": 0}, "durable_agent.E004"),
        ({"RECOVERY_TIMEOUT_MS": 3_600_001}, "durable_agent.E004"),
        ({"RECOVERY_TIMEOUT_MS": 30.0}, "durable_agent.E003"),
        ({"RECOVERY_TIMEOUT_MS": 1000, "EVENT_TIMEOUT_MS": 1000}, "durable_agent.E011"),
        ({"RETENTION_AUDIT_MS": 999}, "durable_agent.E004"),
        ({"RETENTION_TASKS_MS": True}, "durable_agent.E003"),
        ({"RETENTION_PASS_RECORDS_MS": "30d"}, "durable_agent.E003"),
        ({"RETENTION_BATCH_SIZE": 0}, "durable_agent.E004"),
        ({"RETENTION_BATCH_SIZE": None}, "durable_agent.E003"),
    ],
)
def test_checks__invalid_settings(value: object, expected: str) -> None:
    assert expected in ids(DURABLE_AGENT=value, Q_CLUSTER=Q_OK)


def test_checks__none_turns_a_retention_off() -> None:
    off = {
        "RETENTION_PASS_RECORDS_MS": None,
        "RETENTION_AUDIT_MS": None,
        "RETENTION_RECOVERY_EVENTS_MS": None,
        "RETENTION_TASKS_MS": None,
    }
    assert ids(DURABLE_AGENT=off, Q_CLUSTER=Q_OK) == []
    with override_settings(DURABLE_AGENT=off):
        assert conf.retention_audits() is None
    assert conf.retention_audits() == timedelta(days=365)


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


def test_conf__recovery_timeout_defaults_to_upstreams_30_s() -> None:
    assert conf.recovery_timeout() == timedelta(seconds=30)
    with override_settings(DURABLE_AGENT={"RECOVERY_TIMEOUT_MS": 250}):
        assert conf.recovery_timeout() == timedelta(milliseconds=250)


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
        "CONN_MAX_AGE": 0,  # not the cluster
        "CONN_HEALTH_CHECKS": True,
    }
    assert sqlite["OPTIONS"] == {"timeout": 5}  # a copy
    postgres = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}
    assert conf.recommended_database(postgres, CONN_MAX_AGE=60) == {
        **postgres,
        "OPTIONS": {"server_side_binding": True, "prepare_threshold": conf.PREPARE_THRESHOLD},
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }
    # Behind a pooler that cannot keep prepared statements: none; the user's OPTIONS win.
    assert "OPTIONS" not in conf.recommended_database(postgres, prepared=False)
    pooled = {**postgres, "OPTIONS": {"prepare_threshold": None, "sslmode": "require"}}
    assert conf.recommended_database(pooled)["OPTIONS"] == {
        "prepare_threshold": None,
        "sslmode": "require",
        "server_side_binding": True,
    }
    assert pooled["OPTIONS"] == {"prepare_threshold": None, "sslmode": "require"}  # a copy
    with mock.patch("sys.argv", ["manage.py", "qcluster"]):
        assert conf.recommended_database(postgres)["CONN_MAX_AGE"] == 600


SQLITE_OK = conf.recommended_database(
    {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}, CONN_MAX_AGE=600
)


def project_ids(databases: object = None, **settings: object) -> list[str]:
    """The ids check_project reports under ``settings`` (the recommended ones by default).

    Only the check reads the overridden DATABASES; the open connections keep theirs.
    """
    settings.setdefault("Q_CLUSTER", conf.recommended_q_cluster())
    if databases is None:
        settings.setdefault("DATABASES", {"default": SQLITE_OK})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Overriding setting DATABASES", UserWarning)
        with override_settings(**settings):
            return [message.id for message in check_project(databases=databases)]


def test_check_project__the_recommended_configuration_is_clean() -> None:
    assert project_ids() == []


def test_check_project__django_q_missing_from_installed_apps() -> None:
    from django.conf import settings

    apps = [app for app in settings.INSTALLED_APPS if app != "django_q"]
    assert project_ids(INSTALLED_APPS=apps) == ["durable_agent.E020"]


@pytest.mark.parametrize("options", [{}, {"timeout": 20}, {"transaction_mode": "DEFERRED"}])
def test_check_project__sqlite_without_begin_immediate(options: dict[str, object]) -> None:
    database = {**SQLITE_OK, "OPTIONS": options}
    assert project_ids(DATABASES={"default": database}) == ["durable_agent.E021"]


def test_check_project__postgresql_needs_no_transaction_mode() -> None:
    database = conf.recommended_database({"ENGINE": "django.db.backends.postgresql", "NAME": "x"})
    assert project_ids(DATABASES={"default": database}) == []


@pytest.mark.parametrize("broker", [None, "django_q.brokers.orm.ORM", "no.such.Broker"])
def test_check_project__no_alarm_broker_and_no_sweep(broker: str | None) -> None:
    assert project_ids(Q_CLUSTER=conf.recommended_q_cluster(broker_class=broker)) == [
        "durable_agent.W020"
    ]


@pytest.mark.django_db
def test_check_project__a_sweep_schedule_stands_in_for_the_alarm_broker() -> None:
    from django_q.models import Schedule

    cluster = conf.recommended_q_cluster(broker_class=None)
    Schedule.objects.create(func="durable_agent.tasks.sweep", schedule_type=Schedule.MINUTES)
    assert project_ids(databases=["default"], Q_CLUSTER=cluster) == []
    Schedule.objects.all().delete()
    assert project_ids(databases=["default"], Q_CLUSTER=cluster) == ["durable_agent.W020"]


def test_check_project__timeout_not_above_the_longest_pass() -> None:
    cluster = conf.recommended_q_cluster(timeout=600, retry=700)
    assert project_ids(Q_CLUSTER=cluster) == ["durable_agent.W021"]
    with override_settings(DURABLE_AGENT={"EVENT_TIMEOUT_MS": 500_000}):
        assert project_ids(Q_CLUSTER=cluster) == []


def test_check_settings__timeout_at_or_above_retry() -> None:
    cluster = conf.recommended_q_cluster(timeout=960, retry=960)
    assert "durable_agent.W003" in ids(DURABLE_AGENT={}, Q_CLUSTER=cluster)


def test_check_project__atomic_requests() -> None:
    database = {**SQLITE_OK, "ATOMIC_REQUESTS": True}
    assert project_ids(DATABASES={"default": database}) == ["durable_agent.W022"]


def test_check_project__no_persistent_connections_with_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    database = {**SQLITE_OK, "CONN_MAX_AGE": 0}
    assert project_ids(DATABASES={"default": database}) == []  # not in the cluster
    monkeypatch.setattr("sys.argv", ["manage.py", "qcluster"])
    assert project_ids(DATABASES={"default": database}) == ["durable_agent.W023"]
    stock = conf.recommended_q_cluster(broker_class=None)
    assert "durable_agent.W023" not in project_ids(DATABASES={"default": database}, Q_CLUSTER=stock)


def test_checks__an_unknown_setting_names_its_close_match() -> None:
    with override_settings(DURABLE_AGENT={"PASS_WORKER": 1, "pass_workers": 2}, Q_CLUSTER=Q_OK):
        hints = {m.msg: m.hint for m in check_settings() if m.id == "durable_agent.E002"}
    assert hints == {
        "DURABLE_AGENT has an unknown setting 'PASS_WORKER'.": (
            "Did you mean 'PASS_WORKERS'? The settings are listed in docs/settings.md."
        ),
        "DURABLE_AGENT has an unknown setting 'pass_workers'.": (
            "Did you mean 'PASS_WORKERS'? The settings are listed in docs/settings.md."
        ),
    }


def test_checks__an_unknown_setting_like_none_lists_none() -> None:
    with override_settings(DURABLE_AGENT={"NOPE": 1}, Q_CLUSTER=Q_OK):
        (error,) = check_settings()
    assert error.hint == "The settings are listed in docs/settings.md."


@pytest.mark.parametrize(
    ("failing", "violating", "expected"),
    [
        (1, 0, ["1 host is failing: their last passes all failed (h0 (boom))."]),
        (2, 0, ["2 hosts are failing: their last passes all failed (h0 (boom), h1 (boom))."]),
        (0, 1, ["1 host violates the alarm invariant (v0)."]),
        (0, 3, ["3 hosts violate the alarm invariant (v0, v1, v2)."]),
    ],
)
def test_deploy_check__counts_hosts_in_the_right_number(
    failing: int, violating: int, expected: list[str]
) -> None:
    from durable_agent.checks import check_alarm_invariant
    from durable_agent.maintenance.operators import audit

    summary = mock.Mock(
        failing=[mock.Mock(host=f"h{i}", last_error="boom") for i in range(failing)],
        violating=[mock.Mock(host=f"v{i}") for i in range(violating)],
    )
    with mock.patch.object(audit, "audit_all", return_value=summary):
        messages = check_alarm_invariant(databases=["default"])
    assert [m.msg for m in messages] == expected
