"""Settings for the benchmarks: the example project on PostgreSQL, plus a small bench app."""

import os

import dj_database_url

from durable_agent.conf import RECOMMENDED_Q_CLUSTER, recommended_database, recommended_q_cluster
from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS, PERSISTENT_CONN_MAX_AGE, Q_CLUSTER, conn_max_age

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]
DATABASES = {
    "default": recommended_database(
        dj_database_url.parse(
            os.environ.get(
                "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/durable_agent_bench"
            )
        ),
        # Persistent in every bench process but runserver: the clusters and the drivers
        # (whose passes run waves on a kept thread pool) reuse their threads.
        CONN_MAX_AGE=conn_max_age(default=PERSISTENT_CONN_MAX_AGE),
        CONN_HEALTH_CHECKS=os.environ.get("BENCH_HEALTH_CHECKS", "1") == "1",
    )
}
Q_CLUSTER = recommended_q_cluster(
    workers=int(os.environ.get("Q_WORKERS", "2")),
    bulk=int(os.environ.get("Q_BULK", RECOMMENDED_Q_CLUSTER["bulk"])),
    broker_class=Q_CLUSTER.get("broker_class"),
    save_limit=int(os.environ.get("Q_SAVE_LIMIT", RECOMMENDED_Q_CLUSTER["save_limit"])),
)
if os.environ.get("Q_REDIS"):  # bench/lateness.py --broker redis
    Q_CLUSTER["redis"] = os.environ["Q_REDIS"]
if os.environ.get("Q_NAME"):  # a cluster name of its own (a shared Redis, bench/clusters.py)
    Q_CLUSTER["name"] = os.environ["Q_NAME"]
DEBUG = False
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"durable_agent": {"handlers": ["console"], "level": "WARNING"}},
}

if os.environ.get("DA_SOAK"):
    # The soak kills work on purpose: short leases let it recover within the run.
    DURABLE_AGENT = {
        "PASS_LEASE_TTL_MS": 5_000,
        "SWEEP_INTERVAL_MS": 5_000,
        "SWEEP_GRACE_MS": 5_000,
    }

if os.environ.get("DA_RETENTION_MS"):
    # bench/retention.py: short retention ("none" turns it off), a frequent sweep.
    _kept = None if os.environ["DA_RETENTION_MS"] == "none" else int(os.environ["DA_RETENTION_MS"])
    DURABLE_AGENT = {
        "RETENTION_PASS_RECORDS_MS": _kept,
        "RETENTION_AUDIT_MS": _kept,
        "RETENTION_RECOVERY_EVENTS_MS": _kept,
        "RETENTION_TASKS_MS": _kept,
        "RETENTION_BATCH_SIZE": int(os.environ.get("DA_RETENTION_BATCH", "500")),
        "SWEEP_INTERVAL_MS": int(os.environ.get("DA_SWEEP_MS", "5000")),
    }

if os.environ.get("DA_FIRE_AHEAD_MS"):
    # bench/lateness.py --fire-ahead-ms: Note [Fire ahead, run at the deadline] on or off.
    DURABLE_AGENT = {
        **globals().get("DURABLE_AGENT", {}),
        "FIRE_AHEAD_MS": int(os.environ["DA_FIRE_AHEAD_MS"]),
    }

if os.environ.get("DA_BATCH_HOSTS"):
    # An experiment's ALARM_BATCH_HOSTS (docs/settings.md).
    DURABLE_AGENT = {
        **globals().get("DURABLE_AGENT", {}),
        "ALARM_BATCH_HOSTS": int(os.environ["DA_BATCH_HOSTS"]),
    }
