"""``AlarmRedisBroker``: the alarm fast path on django-q2's Redis broker (needs ``redis``).

The slots stay ``Schedule`` rows in the database and fire as with ``AlarmBroker`` (Note [Wake
at the deadline] in ``durable_agent/broker.py``); only the tasks travel through Redis::

    Q_CLUSTER = {..., "orm": "default", "redis": "redis://127.0.0.1:6379/0",
                 "broker_class": "durable_agent.redis_broker.AlarmRedisBroker"}

Two differences from django-q2's own Redis broker:

- The tasks a firing enqueues are pushed when django-q's scheduler transaction commits, so a
  rolled-back firing delivers nothing; the first ``bulk`` of them never go through Redis: they
  are handed to the firing cluster's own workers. A crash between that commit and a worker
  taking such a task loses it (as a crash after a stock Redis pop does); the backstop sweep
  re-arms the host within a minute.
- The pusher takes tasks with a non-blocking ``LPOP`` and waits on the alarm listener between
  looks (at most ``poll``), instead of blocking in ``BLPOP`` for a second: a task enqueued
  elsewhere waits up to ``poll`` for the pusher, as with the ORM broker.

Redis has no visibility timeout: a task whose worker dies is not redelivered. The alarm task is
fenced and the sweep re-arms a host whose slot was consumed by a lost task, so nothing is lost,
but the host waits for the sweep.
"""

from __future__ import annotations

from typing import Any

from django_q.brokers.redis_broker import Redis
from django_q.conf import Conf

from durable_agent.broker import AlarmFiring


class AlarmRedisBroker(AlarmFiring, Redis):  # type: ignore[misc]
    """django-q2's Redis broker plus the fast path (Note [Wake at the deadline])."""

    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key)
        self._init_firing()

    def enqueue(self, task: Any) -> Any:
        """django-q's push; during a firing, at its commit, and a task this cluster keeps
        (``_keep_fired``) goes to this cluster's pusher without a round trip through Redis."""
        if self._take_prompt(task):
            return "(prompt pass)"
        if not self._firing:
            return super().enqueue(task)
        if self._keep_fired():
            self._on_commit(lambda: self._fired.append((None, task)))
        else:
            self._on_commit(lambda: Redis.enqueue(self, task))
        return self.queued_label()  # Note [What a firing's enqueue returns]

    def claim_fired(self) -> Any:
        fired, self._fired = self._fired, []
        return fired

    def ready_tasks(self) -> Any:
        tasks = self.connection.lpop(self.list_key, Conf.BULK)
        return [(None, task) for task in tasks] if tasks else None
