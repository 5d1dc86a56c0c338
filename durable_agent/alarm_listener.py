"""The wake-up channel of ``AlarmBroker``: PostgreSQL LISTEN on the alarm notifications.

Migration 0009 adds a trigger on django-q's ``django_q_schedule``: when a row becomes armed
(inserted armed, re-armed, or its ``next_run`` moved) with a ``next_run`` at most
``NOTIFY_WINDOW`` ahead of the clock, it calls ``pg_notify(CHANNEL, '<cluster> <epoch>')``.
PostgreSQL delivers the notification when the arming transaction commits, so a listener learns
of an alarm armed for "now" the moment it can be fired. The same connection LISTENs on
``PROMPT_CHANNEL``, the producers' prompt hints (``'<cluster> <host id>'``, Note [Prompt hint] in
``durable_agent/maintenance/mutations/gate.py``). Alarms armed further ahead cost no
notification: the broker's probe finds them in time (see Note [Wake at the deadline] in
``durable_agent/broker.py``).

``AlarmListener`` holds one dedicated connection (autocommit, outside Django's connection
handling) that LISTENs on the channel. When that connection fails it is closed and opened again
after ``RECONNECT_DELAY`` seconds; meanwhile ``wait()`` just sleeps and the probe stays the
backstop. On every (re)connection ``wait()`` reports a wake-up, since notifications sent while
the connection was down are lost.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

logger = logging.getLogger("durable_agent.broker")

CHANNEL = "durable_agent_alarm"
PROMPT_CHANNEL = "durable_agent_prompt"  # Note [Prompt hint] in maintenance/mutations/gate.py
LISTEN_SQL = f"LISTEN {CHANNEL}; LISTEN {PROMPT_CHANNEL}"  # one round trip
NOTIFY_WINDOW_SECONDS = 2  # written into migration 0009's trigger
RECONNECT_DELAY = 1.0


@dataclass(frozen=True)
class Wake:
    """One wake-up: an alarm of ``cluster`` (None: the default cluster) due at ``due``; both
    None after a (re)connection, when any alarm may have been missed."""

    cluster: str | None
    due: datetime | None
    host: int | None = None  # a prompt hint: start this host's pass now


def parse(payload: str, channel: str = CHANNEL) -> Wake | None:
    """The ``'<cluster> <epoch seconds>'`` payload of the trigger, or the ``'<cluster> <host
    id>'`` of a prompt hint; None when malformed."""
    cluster, _, epoch = payload.rpartition(" ")
    if channel == PROMPT_CHANNEL:
        if not epoch.isdigit():
            return None
        return Wake(cluster or None, None, host=int(epoch))
    try:
        due = datetime.fromtimestamp(float(epoch), tz=UTC)
    except (ValueError, OverflowError):
        return None
    return Wake(cluster or None, due)


class AlarmListener:
    """A dedicated PostgreSQL connection LISTENing on ``CHANNEL`` (see the module docstring)."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.backend_pid: int | None = None
        self.connections = 0  # how many times it connected (a reconnection count + 1)
        self._conn: Any = None
        self._retry_at = 0.0

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def _connect(self) -> bool:
        import psycopg
        from django.db import connections

        params = connections[self.alias].get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(key, None)
        try:
            conn = psycopg.connect(**params, autocommit=True)
            conn.execute(LISTEN_SQL)
            self.backend_pid = conn.info.backend_pid
        except psycopg.Error:
            logger.warning("The alarm listener could not connect; retrying", exc_info=True)
            self._retry_at = time.monotonic() + RECONNECT_DELAY
            return False
        self._conn = conn
        self.connections += 1
        return True

    def _drop(self) -> None:
        logger.warning("The alarm listener lost its connection; reconnecting", exc_info=True)
        conn, self._conn = self._conn, None
        self.backend_pid = None
        self._retry_at = time.monotonic() + RECONNECT_DELAY
        with contextlib.suppress(Exception):  # already broken: nothing to release
            conn.close()

    def wait(self, timeout: float) -> list[Wake]:
        """Wait up to ``timeout`` seconds for notifications; return them (at once on the first).

        Without a connection it sleeps, reconnecting once ``RECONNECT_DELAY`` has passed; a
        fresh connection returns ``[Wake(None, None)]`` without waiting.
        """
        if self._conn is None:
            if time.monotonic() >= self._retry_at and self._connect():
                return [Wake(None, None)]
            time.sleep(max(0.0, timeout))
            return []
        import psycopg

        wakes: list[Wake] = []
        try:
            for notify in self._conn.notifies(timeout=max(0.0, timeout), stop_after=1):
                wake = parse(notify.payload, notify.channel)
                if wake is not None:
                    wakes.append(wake)
        except psycopg.Error:
            self._drop()
        return wakes

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
