"""The Redis broker variant the benchmarks compare (needs ``redis``)."""

from __future__ import annotations

from durable_agent.redis_broker import AlarmRedisBroker


class ProbeOnlyAlarmRedisBroker(AlarmRedisBroker):
    """AlarmRedisBroker without the LISTEN wake-up: the 0.1 s probe alone."""

    listen = False
