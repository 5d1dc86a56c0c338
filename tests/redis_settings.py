"""The example project with AlarmRedisBroker (tests/test_redis_broker.py's live cluster).

``Q_REDIS`` is the Redis URL, ``Q_NAME`` the cluster name (its own keys on a shared Redis).
"""

import os

from project.settings import *  # noqa: F403
from project.settings import Q_CLUSTER

Q_CLUSTER = {
    **Q_CLUSTER,
    "redis": os.environ["Q_REDIS"],
    "name": os.environ["Q_NAME"],
    "broker_class": "durable_agent.redis_broker.AlarmRedisBroker",
}
