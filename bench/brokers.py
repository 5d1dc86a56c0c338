"""Broker variants the benchmarks compare (``Q_BROKER_CLASS=bench.brokers....``)."""

from __future__ import annotations

from durable_agent.broker import AlarmBroker


class ProbeOnlyAlarmBroker(AlarmBroker):
    """AlarmBroker without the LISTEN wake-up: the 0.1 s probe alone (as on SQLite)."""

    listen = False
