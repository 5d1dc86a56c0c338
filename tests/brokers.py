"""Alarm brokers for live-cluster tests (``Q_BROKER_CLASS=tests.brokers....``)."""

from __future__ import annotations

from durable_agent.broker import AlarmBroker


class NoProbeAlarmBroker(AlarmBroker):
    """Probes once, when the cluster starts, and then only hourly: every later alarm must come
    from a notification (or django-q's own 30 s scan)."""

    probe_interval = 3600.0
    listening_probe_interval = 3600.0
    prompt = False  # the alarm's own notification is under test, not the prompt hint


class NoPromptAlarmBroker(AlarmBroker):
    """Ignores the prompt hints (a lost hint): every pass must come from the slot."""

    prompt = False


class NoListenAlarmBroker(AlarmBroker):
    """No LISTEN connection (the listener down): the 0.1 s probe alone, as on SQLite."""

    listen = False
