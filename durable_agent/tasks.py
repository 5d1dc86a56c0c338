"""django-q entry points."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, Q

from durable_agent import clock, conf
from durable_agent.errors import HostNotFound, PassError
from durable_agent.maintenance import failpoints, passes, retention
from durable_agent.maintenance.passes.finish import MAX_PASS_ERROR_LENGTH
from durable_agent.models import BindingRetry, DueLane, MaintenanceState
from durable_agent.runtime import get_runtime
from durable_agent.text import error_text, storable

logger = logging.getLogger("durable_agent.tasks")


def fire_alarm(host_id: int, deadline: str | datetime | None = None, **_: Any) -> dict[str, Any]:
    """Run the maintenance pass of ``host_id`` for the alarm that fired at ``deadline``.

    At-least-once and idempotent: a stale, early or duplicate delivery changes nothing (the
    early-fire guard); a crashed delivery is redelivered by the broker and fenced the same way.

    Raises:
        PassError: the pass failed (it recorded itself and backed off). Its message is the
            failure's storable description and its traceback is logged here: django-q formats
            and stores what a task raised, and a failure's own ``__str__`` may raise or hold
            what the database cannot store (docs/pass.md "What code raises").
    """
    when = datetime.fromisoformat(deadline) if isinstance(deadline, str) else deadline
    if when is None:  # a delivery without its deadline is guarded as if fired now
        when = clock.now()
    hold_until(when)
    try:  # the pass reads the host in its first transaction
        return passes.run_pass(int(host_id), deadline=when, guard=True).as_dict()
    except HostNotFound:
        logger.warning("Alarm fired for host %s, which no longer exists", host_id)
        return {"host": None, "phase": "stale"}
    except Exception as exc:
        logger.error("The pass of host %s failed", host_id, exc_info=True)
        raise PassError(error_text(exc, limit=MAX_PASS_ERROR_LENGTH)) from None


#: How long one ``fire_alarms`` delivery starts new passes for; the hosts left after it are
#: re-armed (Note [Several hosts per delivered task] in ``durable_agent/broker.py``).
BATCH_BUDGET_SECONDS = 1.0


def fire_alarms(deliveries: list[Any], **_: Any) -> dict[str, Any]:
    """Run the maintenance passes of several hosts whose alarm slots fired together, each as
    ``fire_alarm`` runs one: ``deliveries`` holds ``[host_id, deadline]`` pairs, earliest first.

    Each host's pass keeps its own lease and transactions; a host whose pass fails is logged
    and recorded by its pass, and the next host runs all the same. Once the delivery has run
    for ``BATCH_BUDGET_SECONDS``, it starts no further pass: the hosts left are re-armed
    (``ensure_alarm``, due at once) for another delivery, so a long pass delays the others by
    itself at most (Note [Several hosts per delivered task] in ``durable_agent/broker.py``).

    Raises:
        PassError: after every host ran, when a pass failed: the first failure's description,
            followed by how many of the delivery's passes failed.
    """
    results: list[dict[str, Any]] = []
    failures: list[tuple[int, str]] = []
    started = time.monotonic()
    for index, (host_id, deadline) in enumerate(deliveries):
        if index and time.monotonic() - started > BATCH_BUDGET_SECONDS:
            rearm(
                [int(host) for host, _ in deliveries[index:]],
                "after its delivery ran out of time",
                delivered=True,
            )
            break
        failpoints.hit("maintenance:batch:next")
        try:
            results.append(fire_alarm(host_id, deadline))
        except PassError as exc:
            failures.append((int(host_id), str(exc)))
    if failures:
        hosts = ", ".join(str(host) for host, _ in failures[:10])
        hosts += ", ..." if len(failures) > 10 else ""
        more = f" ({len(failures)} of this delivery's passes failed: hosts {hosts})"
        text = failures[0][1]
        raise PassError(storable(text, limit=MAX_PASS_ERROR_LENGTH - len(more)) + more)
    return {"hosts": results}


def rearm(hosts: list[int], why: str, *, delivered: bool = False) -> int:
    """Arm the alarms of ``hosts`` (``ensure_alarm`` each; a host deleted meanwhile is skipped,
    a failure logged with ``why`` and left to the next sweep); return how many were armed.
    ``delivered``: the caller is the hosts' queued delivery, which will not run their passes."""
    armed = 0
    for host_id in hosts:
        try:
            passes.ensure_alarm(host_id, delivered=delivered)
            armed += 1
        except HostNotFound:
            continue
        except Exception:
            logger.exception("Could not re-arm host %s %s", host_id, why)
    return armed


def prompt_pass(host_id: int, **_: Any) -> dict[str, Any]:
    """Run the maintenance pass of ``host_id`` at once, for a prompt hint (Note [Prompt start]
    in ``durable_agent/maintenance/passes/run.py``).

    With nothing due (another cluster's pass, or the alarm's, got there first) or a pass
    running it returns ``stale`` or ``busy`` and writes nothing; the host's slot stays the
    backstop.

    Raises:
        PassError: the pass failed (it recorded itself and backed off), as ``fire_alarm``.
    """
    try:
        return passes.run_pass(int(host_id), prompt=True).as_dict()
    except HostNotFound:
        return {"host": None, "phase": "stale"}
    except Exception as exc:
        logger.error("The pass of host %s failed", host_id, exc_info=True)
        raise PassError(error_text(exc, limit=MAX_PASS_ERROR_LENGTH)) from None


def hold_until(deadline: datetime) -> None:
    """Wait for ``deadline`` when the delivery arrived at most ``FIRE_AHEAD_MS`` before it
    (Note [Fire ahead, run at the deadline] in ``durable_agent/broker.py``); a delivery that
    early on purpose must not meet the early-fire guard. Anything earlier is not held."""
    early = (deadline - clock.now()).total_seconds()
    if 0 < early <= int(conf.get("FIRE_AHEAD_MS")) / 1000:
        time.sleep(early)


#: Hosts the sweep reads per page (one query each) before it re-arms them.
SWEEP_PAGE_SIZE = 500


def sweep(*, page_size: int = SWEEP_PAGE_SIZE) -> dict[str, int]:
    """The backstop sweep: re-arm every host whose alarm was lost, apply registry changes.

    Finds hosts that owe work (a dirty generation or a lane deadline) with a missing or
    disarmed slot (a crash between django-q's fire and the pass's first commit, a database
    outage, a hand edit), and hosts with binding retries recorded under another registry key
    (a deploy), and runs ``ensure_alarm`` on each; then prunes one batch per table of the rows
    past their retention (``durable_agent.maintenance.operators.retention``): old pass records,
    audit rows, delivered recovery events, long-expired mutation tickets and alarm task results.
    ``AlarmBroker`` runs it every minute; without that broker, schedule this task yourself.
    Returns ``rearmed`` and the number of rows pruned per table.

    Note [The sweep walks in pages]
        The hosts are read by ascending id, ``page_size`` at a time (keyset: each page starts
        after the last id of the previous one), and each page is re-armed before the next one
        is read: the memory the sweep holds is one page, whatever the number of hosts, and a
        host re-armed on one page no longer matches when a later page is read.
    """
    rearmed = 0
    after = 0
    while True:
        page = _sweep_page(after=after, limit=page_size)
        rearmed += rearm(page, "in the sweep")
        if len(page) < page_size:
            break
        after = page[-1]
    pruned = retention.prune()
    if rearmed:
        logger.warning("Sweep re-armed %d hosts whose alarm was missing", rearmed)
    if any(pruned.values()):
        logger.info("Sweep pruned %s", ", ".join(f"{k}={v}" for k, v in pruned.items() if v))
    return {"rearmed": rearmed, **pruned}


def _sweep_page(*, after: int, limit: int) -> list[int]:
    """The ids, ascending and above ``after``, of at most ``limit`` hosts the sweep re-arms
    (Note [The sweep walks in pages], Note [A fired slot is not a lost one])."""
    fired_before = clock.now() - timedelta(milliseconds=int(conf.get("SWEEP_GRACE_MS")))
    lost = Q(host__alarm__isnull=True) | Q(
        host__alarm__repeats=0, host__alarm__next_run__lt=fired_before
    )
    dirty = MaintenanceState.objects.filter(lost, dirty__gt=F("processed"), host_id__gt=after)
    due = DueLane.objects.filter(lost, due_at__isnull=False, host_id__gt=after)
    key = get_runtime().binding_registry_key()
    moved = BindingRetry.objects.filter(host_id__gt=after).exclude(registry_key=key)
    ids = (
        dirty.order_by()
        .values_list("host_id", flat=True)
        .union(
            due.order_by().values_list("host_id", flat=True),
            moved.order_by().values_list("host_id", flat=True),
        )
        .order_by("host_id")
    )
    return list(ids[:limit])


# Note [A fired slot is not a lost one]
#     django-q disarms a ONCE slot (``repeats=0``, ``next_run`` left at the deadline) when it
#     fires it, and the host's delivery may then wait in the queue for a while: behind a burst
#     of due hosts, for minutes. A sweep that called every dirty host with a disarmed slot lost
#     re-armed each of those queued hosts and doubled the work of a cluster that was already
#     behind. So a disarmed slot counts as lost only once its deadline is ``SWEEP_GRACE_MS``
#     old (a minute by default): by then its delivery has run or was lost with its worker. A
#     host with no slot row at all is lost at once. The candidates are read from the three
#     small sets that can hold them (dirty state rows on their partial index, lanes with a
#     deadline, binding retries), never by walking every host.
