"""System checks for the DURABLE_AGENT settings (ids ``durable_agent.E001``...).

Size: one check per setting or deployment rule, each short and documented in
docs/settings.md; they are registered together so ``manage.py check`` lists them in one place.
"""

from __future__ import annotations

import difflib
from ipaddress import ip_network
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils.module_loading import import_string

from durable_agent import conf


def _unknown_setting_hint(name: object, known: set[str]) -> str:
    """Name the close match (``PASS_WORKER`` -> ``PASS_WORKERS``) rather than every setting."""
    close = difflib.get_close_matches(str(name).upper(), sorted(known), n=1, cutoff=0.6)
    if close:
        return f"Did you mean {close[0]!r}? The settings are listed in docs/settings.md."
    return "The settings are listed in docs/settings.md."


def _hosts(count: int, singular: str, plural: str) -> str:
    """``"1 host is"``, ``"3 hosts are"``."""
    return f"1 host {singular}" if count == 1 else f"{count} hosts {plural}"


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    raw = getattr(settings, "DURABLE_AGENT", {})
    if not isinstance(raw, dict):
        return [
            Error(
                "DURABLE_AGENT must be a dict.",
                hint="Set DURABLE_AGENT = {} or a dict of the settings in docs/settings.md.",
                id="durable_agent.E001",
            )
        ]
    known = {s.name for s in conf.SETTINGS}
    for name in sorted(set(raw) - known):
        errors.append(
            Error(
                f"DURABLE_AGENT has an unknown setting {name!r}.",
                hint=_unknown_setting_hint(name, known),
                id="durable_agent.E002",
            )
        )
    for setting in conf.SETTINGS:
        if setting.name not in raw:
            continue
        value = raw[setting.name]
        if isinstance(value, bool) or not isinstance(value, setting.kind):
            errors.append(
                Error(
                    f"DURABLE_AGENT[{setting.name!r}] must be of type {_kind(setting.kind)}, "
                    f"not {type(value).__name__}.",
                    hint=setting.doc,
                    id="durable_agent.E003",
                )
            )
            continue
        if isinstance(value, int) and (
            (setting.minimum is not None and value < setting.minimum)
            or (setting.maximum is not None and value > setting.maximum)
        ):
            errors.append(
                Error(
                    f"DURABLE_AGENT[{setting.name!r}] = {value} is outside "
                    f"{setting.minimum}..{setting.maximum}.",
                    hint=setting.doc,
                    id="durable_agent.E004",
                )
            )
        if setting.name in ("CLOCK", "RANDOM", "ALARM_TASK", "RUNTIME") and isinstance(value, str):
            try:
                target = import_string(value)
            except ImportError as exc:
                errors.append(
                    Error(
                        f"DURABLE_AGENT[{setting.name!r}] = {value!r} cannot be imported: {exc}",
                        id="durable_agent.E005",
                    )
                )
            else:
                if not callable(target):
                    errors.append(
                        Error(
                            f"DURABLE_AGENT[{setting.name!r}] = {value!r} is not callable.",
                            id="durable_agent.E006",
                        )
                    )
    base = raw.get("ALARM_BACKOFF_BASE_MS", conf.get("ALARM_BACKOFF_BASE_MS"))
    cap = raw.get("ALARM_BACKOFF_CAP_MS", conf.get("ALARM_BACKOFF_CAP_MS"))
    if isinstance(base, int) and isinstance(cap, int) and cap < base:
        errors.append(
            Error(
                "DURABLE_AGENT ALARM_BACKOFF_CAP_MS is below ALARM_BACKOFF_BASE_MS.",
                hint="The cap bounds base * 2^stalls; make it at least the base.",
                id="durable_agent.E007",
            )
        )
    lease = raw.get("AGENT_LEASE_TTL_MS", conf.get("AGENT_LEASE_TTL_MS"))
    renewal = raw.get("AGENT_LEASE_RENEWAL_MS", conf.get("AGENT_LEASE_RENEWAL_MS"))
    if isinstance(lease, int) and isinstance(renewal, int) and renewal * 2 > lease:
        errors.append(
            Error(
                "DURABLE_AGENT AGENT_LEASE_RENEWAL_MS must be at most half of AGENT_LEASE_TTL_MS.",
                hint="A lease renewed less often than that can expire under a live attempt.",
                id="durable_agent.E008",
            )
        )
    timings = [
        raw.get(n, conf.get(n)) for n in ("YIELD_AFTER_MS", "DISPATCH_UNTIL_MS", "EVENT_TIMEOUT_MS")
    ]
    if all(isinstance(t, int) for t in timings) and not timings[0] <= timings[1] <= timings[2]:
        errors.append(
            Error(
                "DURABLE_AGENT needs YIELD_AFTER_MS <= DISPATCH_UNTIL_MS <= EVENT_TIMEOUT_MS.",
                id="durable_agent.E009",
            )
        )
    recovery = raw.get("RECOVERY_TIMEOUT_MS", conf.get("RECOVERY_TIMEOUT_MS"))
    deadline = timings[2]
    if isinstance(recovery, int) and isinstance(deadline, int) and recovery >= deadline:
        errors.append(
            Error(
                "DURABLE_AGENT RECOVERY_TIMEOUT_MS must be below EVENT_TIMEOUT_MS.",
                hint="A recovery read bounded past the pass deadline is never cut off.",
                id="durable_agent.E011",
            )
        )
    proxies = raw.get("API_TRUSTED_PROXIES", ())
    for entry in proxies if isinstance(proxies, (list, tuple)) else ():
        try:
            ip_network(str(entry), strict=False)
        except ValueError:
            errors.append(
                Error(
                    f"DURABLE_AGENT API_TRUSTED_PROXIES has {entry!r}, not an address or network.",
                    hint="List the proxies' addresses or networks, e.g. ['10.0.0.0/8'].",
                    id="durable_agent.E012",
                )
            )
    errors.extend(_check_q_cluster())
    return errors


@register()
def check_project(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """The project around the app: INSTALLED_APPS, the database and django-q2's cluster.

    Ids ``durable_agent.E020``... and ``W020``...; docs/settings.md lists them with their fixes.
    ``durable_agent.conf.recommended_q_cluster()`` and ``recommended_database()`` pass them all.
    """
    from django.apps import apps

    messages: list[CheckMessage] = []
    if not apps.is_installed("django_q"):
        messages.append(
            Error(
                '"django_q" is not in INSTALLED_APPS: no alarm slot (a django_q Schedule) can be '
                "created and no cluster runs the passes.",
                hint='Add "django_q" to INSTALLED_APPS, next to "durable_agent".',
                id="durable_agent.E020",
            )
        )
    cluster = getattr(settings, "Q_CLUSTER", None)
    cluster = cluster if isinstance(cluster, dict) else {}
    aliases = sorted({"default", str(cluster.get("orm") or "default")} & set(settings.DATABASES))
    for alias in aliases:
        database = settings.DATABASES[alias]
        if "sqlite3" not in str(database.get("ENGINE", "")):
            continue
        options = database.get("OPTIONS") or {}
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            messages.append(
                Error(
                    f'DATABASES[{alias!r}] is SQLite without OPTIONS["transaction_mode"] = '
                    '"IMMEDIATE": concurrent alarm transactions and the cluster then fail with '
                    '"database is locked".',
                    hint=f"DATABASES[{alias!r}] = durable_agent.conf.recommended_database("
                    f'DATABASES[{alias!r}]), or set OPTIONS["transaction_mode"] = "IMMEDIATE".',
                    id="durable_agent.E021",
                )
            )
    default = settings.DATABASES.get("default", {})
    if default.get("ATOMIC_REQUESTS"):
        messages.append(
            Warning(
                'DATABASES["default"]["ATOMIC_REQUESTS"] is on: durable_agent.submit() and '
                "gate.transaction() refuse to run inside a view's transaction (GateMisuse).",
                hint="Turn ATOMIC_REQUESTS off, or mark the views that submit with "
                "django.db.transaction.non_atomic_requests.",
                id="durable_agent.W022",
            )
        )
    if not cluster:
        return messages  # W001 says so
    fast_path = _is_alarm_broker(cluster.get("broker_class"))
    if not fast_path and not _sweep_scheduled(databases):
        messages.append(
            Warning(
                "Q_CLUSTER has no broker_class durable_agent.broker.AlarmBroker and no "
                "durable_agent.tasks.sweep schedule was found: alarms fire up to ~30 s late "
                "(django-q's own scan), nothing re-arms a lost alarm and nothing prunes old rows "
                "(docs/operations.md, Retention).",
                hint='Set Q_CLUSTER["broker_class"] = "durable_agent.broker.AlarmBroker" '
                "(durable_agent.conf.recommended_q_cluster() does), or schedule "
                "durable_agent.tasks.sweep every minute and run `manage.py check --database "
                "default`.",
                id="durable_agent.W020",
            )
        )
    timeout = cluster.get("timeout")
    pass_limit_ms = int(conf.get("EVENT_TIMEOUT_MS"))
    if isinstance(timeout, int | float) and timeout * 1000 <= pass_limit_ms:
        messages.append(
            Warning(
                f'Q_CLUSTER["timeout"] = {timeout} s is not above the longest pass '
                f"(EVENT_TIMEOUT_MS = {pass_limit_ms} ms): django-q2 kills a pass that "
                "is still within its allowance.",
                hint=f'Set Q_CLUSTER["timeout"] above {pass_limit_ms // 1000} s (900 with the '
                "defaults) and retry above timeout, or lower EVENT_TIMEOUT_MS.",
                id="durable_agent.W021",
            )
        )
    orm_alias = str(cluster.get("orm") or "default")
    orm_database = settings.DATABASES.get(orm_alias, {})
    if (
        fast_path
        and orm_database
        and orm_database.get("CONN_MAX_AGE", 0) == 0
        and conf.running_qcluster()
    ):
        messages.append(
            Warning(
                f"Persistent connections are off (DATABASES[{orm_alias!r}]['CONN_MAX_AGE'] = 0) "
                "with AlarmBroker's fast path on: the cluster opens a new connection for every "
                "probe, dequeue and task.",
                hint=f"DATABASES[{orm_alias!r}] = durable_agent.conf.recommended_database("
                f"DATABASES[{orm_alias!r}]) (CONN_MAX_AGE 600 with health checks).",
                id="durable_agent.W023",
            )
        )
    return messages


@register()
def check_cluster_database(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``manage.py qcluster`` only: its database is reachable and migrated (E022).

    Without it a cluster on an unmigrated database starts anyway and each of its processes
    logs a traceback per missing table; the check stops it first with one message.
    """
    if not conf.running_qcluster():
        return []
    cluster = getattr(settings, "Q_CLUSTER", None)
    alias = str((cluster if isinstance(cluster, dict) else {}).get("orm") or "default")
    hint = f"Run `manage.py migrate --database {alias}`, then start qcluster again."
    try:
        executor = MigrationExecutor(connections[alias])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return [
            Error(
                f"qcluster cannot read the migrations of database {alias!r}: {first}",
                hint=f"Check DATABASES[{alias!r}] and that the database server is up.",
                id="durable_agent.E022",
            )
        ]
    if not plan:
        return []
    migration = plan[0][0]
    return [
        Error(
            f"The database {alias!r} is not migrated ({len(plan)} migrations unapplied, the "
            f"first {migration.app_label}.{migration.name}): the cluster cannot run.",
            hint=hint,
            id="durable_agent.E022",
        )
    ]


def _is_alarm_broker(path: object) -> bool:
    if not isinstance(path, str) or not path:
        return False
    # deferred: Django - broker imports django_q models; checks is imported from AppConfig.ready
    from durable_agent.broker import AlarmFiring

    try:
        broker = import_string(path)
    except ImportError:
        return False
    return isinstance(broker, type) and issubclass(broker, AlarmFiring)


def _sweep_scheduled(databases: Any) -> bool:
    """With ``--database``: whether a django_q Schedule runs ``durable_agent.tasks.sweep``."""
    from django.apps import apps

    if not databases or not apps.is_installed("django_q"):
        return False
    from django.db import DatabaseError
    from django_q.models import Schedule

    try:
        return bool(Schedule.objects.filter(func="durable_agent.tasks.sweep").exists())
    except DatabaseError:
        return False


def _check_q_cluster() -> list[CheckMessage]:
    cluster = getattr(settings, "Q_CLUSTER", None)
    if not isinstance(cluster, dict):
        return [
            Warning(
                "Q_CLUSTER is not set; django-q2 will not run the alarm slots.",
                hint="Configure Q_CLUSTER with the ORM broker (see docs/settings.md).",
                id="durable_agent.W001",
            )
        ]
    messages: list[CheckMessage] = []
    orm = cluster.get("orm")
    if orm is not None and orm != "default":
        messages.append(
            Warning(
                f"Q_CLUSTER['orm'] is {orm!r}: alarm enqueueing then cannot join the "
                "source transaction on 'default'.",
                hint="Use the ORM broker on the same alias as your source writes.",
                id="durable_agent.W002",
            )
        )
    timeout, retry = cluster.get("timeout"), cluster.get("retry")
    if (
        not isinstance(timeout, int | float)
        or not isinstance(retry, int | float)
        or timeout >= retry
    ):
        messages.append(
            Warning(
                "Q_CLUSTER needs a 'timeout' below 'retry', or the broker redelivers "
                "running passes.",
                hint="For example timeout=900 and retry=960.",
                id="durable_agent.W003",
            )
        )
    return messages


def _kind(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("None" if k is type(None) else k.__name__ for k in kinds)


@register("durable_agent", deploy=True)
def check_alarm_invariant(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """``manage.py check --deploy --database default``: audit every host's alarm."""
    if not databases:
        return []
    from django.db import DatabaseError

    # deferred: Django - both import models; checks is imported from AppConfig.ready
    from durable_agent.maintenance.operators.audit import audit_all
    from durable_agent.runtime import get_runtime  # deferred: Django - settings read at import

    try:
        summary = audit_all(registry_key=get_runtime().binding_registry_key())
    except DatabaseError as exc:
        return [
            Warning(
                f"The alarm invariant could not be audited: {exc}",
                hint="Run migrations, then manage.py maintenance_audit.",
                id="durable_agent.W010",
            )
        ]
    messages: list[CheckMessage] = []
    if summary.violating:
        hosts = ", ".join(h.host for h in summary.violating[:10])
        messages.append(
            Error(
                f"{_hosts(len(summary.violating), 'violates', 'violate')} the alarm invariant "
                f"({hosts}).",
                hint="Run manage.py maintenance_audit for details, --repair to re-arm them.",
                id="durable_agent.E010",
            )
        )
    if summary.failing:
        hosts = ", ".join(f"{h.host} ({h.last_error[:80]})" for h in summary.failing[:10])
        # A warning, not an error: the deploy being checked may be the one that fixes them.
        messages.append(
            Warning(
                f"{_hosts(len(summary.failing), 'is', 'are')} failing: their last passes all "
                f"failed ({hosts}).",
                hint="Run manage.py maintenance_audit for the errors; see docs/operations.md.",
                id="durable_agent.W011",
            )
        )
    return messages
