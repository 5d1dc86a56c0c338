"""Typed, lazily read settings: the ``DURABLE_AGENT`` dict in Django settings.

Every value is read at call time, so ``override_settings(DURABLE_AGENT={...})`` works. Durations
are milliseconds, as upstream. ``checks.py`` validates the dict (``durable_agent.E0xx``).

``recommended_q_cluster()`` and ``recommended_database()`` are the one known-good configuration
of django-q2 and the database; a project's settings module calls them (importing this module
touches no settings and no models).

Size: one documented accessor per setting; a flat list of declarations.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    kind: type | tuple[type, ...]
    minimum: int | None = None
    maximum: int | None = None
    doc: str = ""


DAY_MS = 86_400_000
MAX_RETENTION_MS = 36_500 * DAY_MS

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "ALARM_BACKOFF_BASE_MS",
        100,
        int,
        1,
        3_600_000,
        "Base of the maintenance backoff; the minimum alarm delay is ceil(base / 2).",
    ),
    Setting(
        "ALARM_BACKOFF_CAP_MS",
        5_000,
        int,
        1,
        86_400_000,
        "Cap of the no-progress and failure backoff of the native lane.",
    ),
    Setting(
        "MUTATION_TICKET_TTL_MS",
        60_000,
        int,
        1_000,
        3_600_000,
        "How long a mutation ticket of a crashed process blocks acknowledgement.",
    ),
    Setting(
        "PASS_LEASE_TTL_MS",
        30_000,
        int,
        1_000,
        3_600_000,
        "How long a crashed pass blocks its host.",
    ),
    Setting(
        "ALARM_TASK",
        "durable_agent.tasks.fire_alarm",
        str,
        None,
        None,
        "The django-q task every alarm slot runs.",
    ),
    Setting(
        "ALARM_CLUSTER",
        None,
        (str, type(None)),
        None,
        None,
        "django-q cluster name the alarm slots run on (None = the default cluster).",
    ),
    Setting(
        "RUNTIME",
        "durable_agent.agents.runtime.ReferenceRuntime",
        str,
        None,
        None,
        "Dotted path to the runtime (a class or an instance) the pass drives.",
    ),
    Setting(
        "AGENT_LEASE_TTL_MS",
        30_000,
        int,
        1_000,
        3_600_000,
        "How long an attempt owns its submission without renewing (a dead attempt's limit).",
    ),
    Setting(
        "AGENT_LEASE_RENEWAL_MS",
        10_000,
        int,
        100,
        3_600_000,
        "How often a running attempt renews its lease (keep it well below the TTL).",
    ),
    Setting(
        "SWEEP_INTERVAL_MS",
        60_000,
        int,
        1_000,
        3_600_000,
        "How often AlarmBroker runs the backstop sweep (also once when a cluster starts).",
    ),
    Setting(
        "SWEEP_GRACE_MS",
        60_000,
        int,
        0,
        86_400_000,
        "How long a fired slot's delivery may wait in the queue before the sweep calls the "
        "alarm lost and re-arms its host; until then producers leave the slot to that "
        "delivery.",
    ),
    Setting(
        "FIRE_AHEAD_MS",
        10,
        int,
        0,
        1_000,
        "How far ahead of its deadline AlarmBroker fires an alarm slot; the worker holds the "
        "delivery until the deadline, so the pass starts at it (0: fire at the deadline).",
    ),
    Setting(
        "ALARM_BATCH_HOSTS",
        8,
        int,
        1,
        100,
        "How many hosts whose alarm slots fire together AlarmBroker hands to one alarm task "
        "(each host's pass stays its own); 1: one task per host.",
    ),
    Setting(
        "PASS_WORKERS",
        2,
        int,
        1,
        8,
        "Threads a pass may use for head attempts and lane waves (1 = run inline).",
    ),
    Setting("PASS_HISTORY", 200, int, 1, 100_000, "PassRecord rows kept per host."),
    Setting(
        "FAILING_AFTER_PASSES",
        3,
        int,
        1,
        1_000,
        "Failed passes in a row after which a host is reported as failing.",
    ),
    Setting(
        "YIELD_AFTER_MS",
        600_000,
        int,
        1,
        3_600_000,
        "After this long a pass admits no new attempt or wave.",
    ),
    Setting(
        "DISPATCH_UNTIL_MS",
        840_000,
        int,
        1,
        3_600_000,
        "An admitted wave must be able to finish before this point of the pass.",
    ),
    Setting(
        "EVENT_TIMEOUT_MS",
        840_000,
        int,
        1,
        3_600_000,
        "The cooperative deadline of a whole pass.",
    ),
    Setting(
        "RECOVERY_TIMEOUT_MS",
        30_000,
        int,
        1,
        3_600_000,
        "How long a pass waits for one recovery read of the runtime before faulting its thread.",
    ),
    Setting(
        "API_AUTH_FAILURES_PER_MINUTE",
        20,
        int,
        0,
        1_000_000,
        "Refused API tokens a client address may send per minute before 429s (0 = no limit).",
    ),
    Setting(
        "API_TRUSTED_PROXIES",
        (),
        (list, tuple),
        None,
        None,
        "Addresses or networks of the proxies whose X-Forwarded-For the API failure limit trusts.",
    ),
    Setting(
        "RETENTION_PASS_RECORDS_MS",
        30 * DAY_MS,
        (int, type(None)),
        1_000,
        MAX_RETENTION_MS,
        "PassRecord rows older than this are pruned by the sweep (None = only PASS_HISTORY).",
    ),
    Setting(
        "RETENTION_AUDIT_MS",
        365 * DAY_MS,
        (int, type(None)),
        1_000,
        MAX_RETENTION_MS,
        "AlarmAudit rows older than this are pruned by the sweep (None = keep forever).",
    ),
    Setting(
        "RETENTION_RECOVERY_EVENTS_MS",
        30 * DAY_MS,
        (int, type(None)),
        1_000,
        MAX_RETENTION_MS,
        "Delivered RecoveryEvent rows are pruned this long after delivery (None = keep).",
    ),
    Setting(
        "RETENTION_TASKS_MS",
        7 * DAY_MS,
        (int, type(None)),
        1_000,
        MAX_RETENTION_MS,
        "django-q Task rows of the alarm task older than this are pruned (None = keep).",
    ),
    Setting(
        "RETENTION_SUBMISSIONS_MS",
        None,
        (int, type(None)),
        1_000,
        MAX_RETENTION_MS,
        "Settled submissions older than this are pruned by the sweep, the last of each thread "
        "kept (None = keep forever).",
    ),
    Setting(
        "RETENTION_BATCH_SIZE",
        500,
        int,
        1,
        10_000,
        "Rows the sweep deletes per table per run, in one short transaction each.",
    ),
    Setting(
        "CLOCK",
        None,
        (str, type(None)),
        None,
        None,
        "Dotted path to a zero-argument callable returning an aware datetime.",
    ),
    Setting(
        "RANDOM",
        None,
        (str, type(None)),
        None,
        None,
        "Dotted path to a zero-argument callable returning a float in [0, 1).",
    ),
)
_BY_NAME = {s.name: s for s in SETTINGS}


def _raw() -> dict[str, Any]:
    """The ``DURABLE_AGENT`` setting as given (read, never written: no copy per lookup)."""
    value = getattr(settings, "DURABLE_AGENT", None)
    return value if isinstance(value, dict) else {}


def get_default(name: str) -> Any:
    return _BY_NAME[name].default


def get(name: str) -> Any:
    """Return the configured value of ``name`` (or its default)."""
    setting = _BY_NAME[name]
    return _raw().get(name, setting.default)


def backoff_base_ms() -> int:
    return int(get("ALARM_BACKOFF_BASE_MS"))


def backoff_cap_ms() -> int:
    return int(get("ALARM_BACKOFF_CAP_MS"))


def minimum_alarm_delay_ms() -> int:
    """``max(1, ceil(base / 2))``: 50 ms by default."""
    return max(1, math.ceil(backoff_base_ms() / 2))


def minimum_alarm_delay() -> timedelta:
    return timedelta(milliseconds=minimum_alarm_delay_ms())


def mutation_ticket_ttl() -> timedelta:
    return timedelta(milliseconds=int(get("MUTATION_TICKET_TTL_MS")))


def pass_lease_ttl() -> timedelta:
    return timedelta(milliseconds=int(get("PASS_LEASE_TTL_MS")))


def alarm_task() -> str:
    return str(get("ALARM_TASK"))


def alarm_cluster() -> str | None:
    value = get("ALARM_CLUSTER")
    return None if value is None else str(value)


def agent_lease_ttl() -> timedelta:
    return timedelta(milliseconds=int(get("AGENT_LEASE_TTL_MS")))


def agent_lease_renewal() -> timedelta:
    return timedelta(milliseconds=int(get("AGENT_LEASE_RENEWAL_MS")))


def pass_workers() -> int:
    return int(get("PASS_WORKERS"))


def pass_history() -> int:
    return int(get("PASS_HISTORY"))


def yield_after() -> timedelta:
    return timedelta(milliseconds=int(get("YIELD_AFTER_MS")))


def dispatch_until() -> timedelta:
    return timedelta(milliseconds=int(get("DISPATCH_UNTIL_MS")))


def event_timeout() -> timedelta:
    return timedelta(milliseconds=int(get("EVENT_TIMEOUT_MS")))


def recovery_timeout() -> timedelta:
    return timedelta(milliseconds=int(get("RECOVERY_TIMEOUT_MS")))


def api_auth_failures_per_minute() -> int:
    return int(get("API_AUTH_FAILURES_PER_MINUTE"))


def api_trusted_proxies() -> tuple[str, ...]:
    return tuple(str(entry) for entry in get("API_TRUSTED_PROXIES"))


def clock_callable() -> Callable[[], datetime] | None:
    path = get("CLOCK")
    return None if path is None else import_string(path)


def random_callable() -> Callable[[], float] | None:
    path = get("RANDOM")
    return None if path is None else import_string(path)


#: The task that carries several hosts whose alarm slots fired together (Note [Several hosts
#: per delivered task] in ``durable_agent/broker.py``).
BATCH_ALARM_TASK = "durable_agent.tasks.fire_alarms"

# The known-good ``Q_CLUSTER``; docs/settings.md explains every value. Keep it in step with the
# system checks in checks.py (W003-W005 hold a configuration to it).
RECOMMENDED_Q_CLUSTER: Mapping[str, Any] = {
    "name": "durable_agent",
    # The ORM broker on the alias the source writes use, so an enqueue joins their transaction.
    "orm": "default",
    # Small: the retry clock starts when the pusher prefetches a task.
    "queue_limit": 4,
    # Seconds; above the longest pass (EVENT_TIMEOUT_MS, 14 minutes) and below ``retry``.
    "timeout": 900,
    "retry": 960,
    # Seconds between the idle broker's looks for queued tasks; adds to alarm latency.
    "poll": 0.05,
    # The pusher claims up to 4 queued tasks per query.
    "bulk": 4,
    # The fast path (due alarms fire within ~0.1 s, not django-q's ~30 s scan) and the sweep.
    "broker_class": "durable_agent.broker.AlarmBroker",
    "catch_up": False,
    # A failed pass already re-armed its own backoff; do not redeliver it every ``retry``.
    "ack_failures": True,
    "max_attempts": 0,
    # PassRecord is the pass history; django-q's Success rows would cost a locked scan per task.
    "save_limit": -1,
}

# Persistent connections in the cluster: django-q's pusher, monitor and workers call
# close_old_connections() around every task, which with CONN_MAX_AGE=0 opens a new connection
# each time. Elsewhere (runserver starts a thread per request) a kept connection is never
# reused, so recommended_database() keeps them only in the qcluster process.
RECOMMENDED_CONN_MAX_AGE = 600

# Note [Prepared statements on PostgreSQL]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Django sends every statement to PostgreSQL as text with its parameters quoted in, and turns
# psycopg's prepared statements off, so the server parses and plans each pass's statements
# every time. A pass runs the same few statements (compiled once, Note [Reads compiled once])
# for every host, so recommended_database() turns on server-side binding with psycopg's
# prepared statements (a statement run PREPARE_THRESHOLD times on a connection is prepared
# there and planned once). A burst of due hosts drains faster with them (docs/benchmarks.md,
# "Prepared statements"). A connection pooler in transaction mode (PgBouncer before 1.21, or
# without max_prepared_statements) cannot keep prepared statements: pass prepared=False, or set
# the two OPTIONS yourself; keys already in OPTIONS are left as they are.
PREPARE_THRESHOLD = 5


def _psycopg3() -> bool:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return True


def running_qcluster(argv: Sequence[str] | None = None) -> bool:
    """Whether this process is ``manage.py qcluster`` (or ``django-admin qcluster``)."""
    argv = sys.argv if argv is None else argv
    return len(argv) > 1 and argv[1] == "qcluster"


def recommended_q_cluster(**overrides: Any) -> dict[str, Any]:
    """The recommended ``Q_CLUSTER`` dict, with ``overrides`` applied on top.

    ``Q_CLUSTER = recommended_q_cluster(workers=4)``. A key set to ``None`` is removed, so
    django-q2's own default applies to it.
    """
    cluster = {**RECOMMENDED_Q_CLUSTER, **overrides}
    return {key: value for key, value in cluster.items() if value is not None}


def recommended_database(
    database: Mapping[str, Any], *, prepared: bool = True, **overrides: Any
) -> dict[str, Any]:
    """A copy of one ``DATABASES`` entry with the options durable_agent needs.

    Every engine gets connection health checks, and persistent connections (``CONN_MAX_AGE``
    600) in the ``qcluster`` process, 0 in any other. SQLite also gets
    ``OPTIONS["transaction_mode"] = "IMMEDIATE"`` (``BEGIN IMMEDIATE`` is what serialises its
    writers; without it concurrent transactions fail with "database is locked") and a 20 s busy
    ``timeout`` unless one is set. PostgreSQL with psycopg 3 gets server-side binding and
    prepared statements (``OPTIONS`` ``server_side_binding`` and ``prepare_threshold``, unless
    set) when ``prepared`` is true: pass ``prepared=False`` behind a pooler in transaction mode
    that cannot keep them (Note [Prepared statements on PostgreSQL]). Top-level ``overrides``
    (for example ``CONN_MAX_AGE=600`` for a WSGI server whose threads are reused) are applied
    last::

        DATABASES["default"] = recommended_database(DATABASES["default"])
    """
    result: dict[str, Any] = {
        **database,
        "CONN_MAX_AGE": RECOMMENDED_CONN_MAX_AGE if running_qcluster() else 0,
        "CONN_HEALTH_CHECKS": True,
    }
    if "sqlite3" in str(database.get("ENGINE", "")):
        options = dict(database.get("OPTIONS") or {})
        options["transaction_mode"] = "IMMEDIATE"
        options.setdefault("timeout", 20)
        result["OPTIONS"] = options
    elif prepared and "postgresql" in str(database.get("ENGINE", "")) and _psycopg3():
        # Note [Prepared statements on PostgreSQL]
        options = dict(database.get("OPTIONS") or {})
        options.setdefault("server_side_binding", True)
        options.setdefault("prepare_threshold", PREPARE_THRESHOLD)
        result["OPTIONS"] = options
    result.update(overrides)
    return result


def _retention(name: str) -> timedelta | None:
    value = get(name)
    return None if value is None else timedelta(milliseconds=int(value))


def retention_pass_records() -> timedelta | None:
    return _retention("RETENTION_PASS_RECORDS_MS")


def retention_audits() -> timedelta | None:
    return _retention("RETENTION_AUDIT_MS")


def retention_recovery_events() -> timedelta | None:
    return _retention("RETENTION_RECOVERY_EVENTS_MS")


def retention_tasks() -> timedelta | None:
    return _retention("RETENTION_TASKS_MS")


def retention_submissions() -> timedelta | None:
    return _retention("RETENTION_SUBMISSIONS_MS")


def retention_batch_size() -> int:
    return int(get("RETENTION_BATCH_SIZE"))
