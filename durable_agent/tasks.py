"""django-q entry points."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, router, transaction
from django.db.models import F, Q

from durable_agent import clock, conf
from durable_agent.errors import HostNotFound, PassError
from durable_agent.maintenance import failpoints, passes, retention
from durable_agent.maintenance.passes.finish import MAX_PASS_ERROR_LENGTH, PassReport
from durable_agent.maintenance.passes.run import begin, run_begun
from durable_agent.maintenance.passes.state import Lease, Pass, renew
from durable_agent.maintenance.passes.waves import one_wave_only, run_waves_together
from durable_agent.maintenance.store.rows import lock_and_read_many, read_ahead, writes_gathered
from durable_agent.maintenance.store.transactions import user_atomic_depth
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
    when = _deadline(deadline)  # a delivery without its deadline is guarded as if fired now
    hold_until(when)
    return _fire(int(host_id), when)


def _fire(host_id: int, when: datetime) -> dict[str, Any]:
    """``fire_alarm`` once held until its deadline."""
    try:  # the pass reads the host in its first transaction
        return passes.run_pass(host_id, deadline=when, guard=True).as_dict()
    except HostNotFound:
        logger.warning("Alarm fired for host %s, which no longer exists", host_id)
        return {"host": None, "phase": "stale"}
    except Exception as exc:
        raise _pass_failed(host_id, exc) from None


#: How long one ``fire_alarms`` delivery begins new groups of passes for; the hosts left after
#: it are re-armed (Note [Several hosts per delivered task] in ``durable_agent/broker.py``).
BATCH_BUDGET_SECONDS = 1.0


def fire_alarms(deliveries: list[Any], **_: Any) -> dict[str, Any]:
    """Run the maintenance passes of several hosts whose alarm slots fired together, each as
    ``fire_alarm`` runs one: ``deliveries`` holds ``[host_id, deadline]`` pairs, earliest first.

    Each host's pass keeps its own lease and transactions but its begin, which it shares with
    the others of its group (Note [A delivery's passes begin together]); a host whose pass
    fails is logged and recorded by its pass, and the next host runs all the same. Once the
    delivery has run for ``BATCH_BUDGET_SECONDS``, it begins no further group: the hosts left
    are re-armed (``ensure_alarm``, due at once) for another delivery, so a long pass delays
    by itself at most the others of its group and none after it (Note [Several hosts per
    delivered task] in ``durable_agent/broker.py``).

    Raises:
        PassError: after every host ran, when a pass failed: the first failure's description,
            followed by how many of the delivery's passes failed.
    """
    results: list[dict[str, Any]] = []
    failures: list[tuple[int, str]] = []
    started = time.monotonic()
    pairs = [(int(host_id), _deadline(deadline)) for host_id, deadline in deliveries]
    for start in range(0, len(pairs), GROUP):
        if start and time.monotonic() - started > BATCH_BUDGET_SECONDS:
            rearm(
                [host for host, _ in pairs[start:]],
                "after its delivery ran out of time",
                delivered=True,
            )
            break
        group = pairs[start : start + GROUP]
        for pair in group:
            hold_until(pair[1])
        begun_group = begin_together(group)
        together = _waves_together(begun_group)
        for (host_id, when), begun in zip(group, begun_group, strict=True):
            failpoints.hit("maintenance:batch:next")
            try:
                if host_id in together:
                    results.append(_outcome(host_id, together[host_id]))
                else:
                    results.append(
                        _fire(host_id, when) if begun is None else _run_begun(host_id, begun)
                    )
            except PassError as exc:
                failures.append((host_id, str(exc)))
    if failures:
        hosts = ", ".join(str(host) for host, _ in failures[:10])
        hosts += ", ..." if len(failures) > 10 else ""
        more = f" ({len(failures)} of this delivery's passes failed: hosts {hosts})"
        text = failures[0][1]
        raise PassError(storable(text, limit=MAX_PASS_ERROR_LENGTH - len(more)) + more)
    return {"hosts": results}


def _deadline(deadline: str | datetime | None) -> datetime:
    """A delivery's deadline as ``fire_alarm`` reads it (now when it carries none)."""
    when = datetime.fromisoformat(deadline) if isinstance(deadline, str) else deadline
    return clock.now() if when is None else when


def _waves_together(begun: list[Pass | None]) -> dict[int, PassReport | Exception]:
    """Run the passes of ``begun`` that have one wave to run and still hold their lease
    together (Note [A group's finishes together] in ``durable_agent/maintenance/passes/
    waves.py``), when there are two or more: their outcomes by host id."""
    waves = [p for p in begun if one_wave_only(p) and keep_lease(p)]
    return run_waves_together(waves) if len(waves) > 1 else {}


def _outcome(host_id: int, outcome: PassReport | Exception) -> dict[str, Any]:
    """``fire_alarm``'s answer for a pass run together with others."""
    if isinstance(outcome, Exception):
        raise _pass_failed(host_id, outcome)
    return outcome.as_dict()


def _pass_failed(host_id: int | str, exc: Exception) -> PassError:
    """What a task raises for a pass that failed with ``exc``, its traceback logged here
    (``fire_alarm``'s Raises)."""
    logger.error("The pass of host %s failed", host_id, exc_info=exc)
    return PassError(error_text(exc, limit=MAX_PASS_ERROR_LENGTH))


def _run_begun(host_id: int, p: Pass) -> dict[str, Any]:
    """``fire_alarm`` for a pass ``begin_together`` began."""
    if not keep_lease(p):
        logger.warning("The lease of host %s was lost before its pass ran", host_id)
        return {"host": p.host.key, "phase": "busy"}
    try:
        return run_begun(p).as_dict()
    except Exception as exc:
        raise _pass_failed(host_id, exc) from None


#: How many hosts of a delivery one transaction begins at most (Note [A delivery's passes
#: begin together]); ``fire_alarms`` checks its time budget between groups, so with the
#: default ``ALARM_BATCH_HOSTS`` (8) a long pass delays at most the three others of its group.
GROUP = 4


def begin_together(deliveries: Sequence[tuple[int, datetime]]) -> list[Pass | None]:
    """Begin the passes of ``deliveries`` (``(host_id, deadline)`` pairs, the early-fire
    guard applying) in one transaction; for each, the begun pass, or None where the host is
    to run alone (``run_pass``): another transaction holds its state row, it has none yet, the
    group's transaction failed, or this database or the caller's transaction does not allow
    it.

    Note [A delivery's passes begin together]
        A burst host's pass is two alarm transactions, its begin and its completion, and each
        costs a ``BEGIN``, a ``COMMIT`` and Django's atomic block around them, in the worker
        and in the server, whatever it holds. ``fire_alarms`` begins the passes of a group of
        its hosts (at most ``GROUP``) in one transaction: this locks the state rows of the
        group's hosts that no other transaction holds (one statement, ``FOR UPDATE SKIP
        LOCKED``, in ascending id order), then runs each locked host's ``begin``
        (``durable_agent/maintenance/passes/run.py``) inside that transaction, in ascending id
        order, without a savepoint, and commits once. Each begin is the one a pass run alone
        makes: its own lease, its own early-fire guard, its own slot write, its own lanes. The
        passes then run one after the other (``run_begun``), each as after its own begin.

        Locks. The group's state rows are taken up front and never waited for: a host whose
        state row another transaction holds (a producer's commit, another cluster's pass), or
        that has no state row yet, is not begun here and runs alone afterwards, as every pass
        did before. One call then re-locks each locked host's state row (held already) and
        locks its lanes, host after host in ascending id order, and reads them (Note [A
        group's reads in one call] in ``durable_agent/maintenance/store/rows.py``); no
        transaction locks a host's lanes without first holding its state row (Note [Lock
        order] in ``durable_agent/maintenance/store/transactions.py``), so the group's
        transaction waits for no state row or lane another transaction holds and cannot
        deadlock with any. Within it the order is Note [Lock order]'s, one host after another
        in ascending id order, as a gate frame carrying several hosts takes them
        (tests/locks.py checks both), but for the slots: every begin's writes, its slot's
        included, go out in one statement at the group's end (Note [A group's writes in one
        statement], which says why no transaction can wait on that order).

        Failure. Any error in the group's transaction rolls all of it back, and every host of
        the group runs alone, exactly as before this note (a host whose begin failed fails
        again in a transaction of its own, and the others begin). A failure of one host's
        begin costs the others one begin that changed nothing, not their passes.

        Flush. Each begin that took its lease would commit without waiting for the WAL flush
        (Note [Begin does not wait for the flush] in ``durable_agent/maintenance/passes/
        run.py``); the group's transaction does the same when every begun host took its lease,
        and waits for its flush when any begin ended otherwise (an early-fire guard that
        re-armed the slot, a busy lease), as that begin alone would have.

        Waiting its turn. A begun pass holds its lease, and its slot is armed at the lease's
        expiry, from the group's commit until its own pass ends, but only its own pass renews
        the lease (``heartbeat``). Before a begun pass runs, ``keep_lease`` renews the lease
        once a third of its TTL has gone by, as that heartbeat would; a lease found lost (it
        expired behind a long pass and another pass took it) is not run here: that other pass
        owns the host. A crash between the commit and a host's pass leaves that host's slot
        armed at its lease's expiry, as a crash after any begin does.
    """
    alias = router.db_for_write(MaintenanceState)
    if (
        len(deliveries) < 2
        or alias != DEFAULT_DB_ALIAS  # where alarm transactions run (``run_alarm_transaction``)
        or connections[alias].vendor != "postgresql"
        or user_atomic_depth(alias) > 0
        or len({host for host, _ in deliveries}) != len(deliveries)
    ):
        return [None] * len(deliveries)
    runtime = get_runtime()
    made = {
        host_id: Pass(host_id, runtime, clock.now(), slot_time=deadline, guard=True)
        for host_id, deadline in deliveries
    }
    begun: set[int] = set()
    try:
        with transaction.atomic(using=alias):
            locked = sorted(_lock_free(alias, list(made)))
            # Note [A group's reads in one call], Note [A group's writes in one statement]
            with read_ahead(lock_and_read_many(locked)), writes_gathered(alias):
                for host_id in locked:
                    begin(made[host_id], join=True)
                    begun.add(host_id)
            if any(not isinstance(made[host_id].lease, Lease) for host_id in begun):
                _flushed(alias)
    except Exception:
        logger.warning(
            "Beginning %d passes together failed; each begins alone", len(made), exc_info=True
        )
        return [None] * len(deliveries)
    return [made[host_id] if host_id in begun else None for host_id, _ in deliveries]


def keep_lease(p: Pass) -> bool:
    """Before a begun pass runs: renew its lease once a third of its TTL has gone by; False
    when the lease is no longer this pass's (Note [A delivery's passes begin together])."""
    lease = p.lease
    if not isinstance(lease, Lease):
        return True
    if lease.expires_at - clock.now() > conf.pass_lease_ttl() * 2 / 3:
        return True
    return renew(lease)


def _lock_free(alias: str, hosts: list[int]) -> set[int]:
    """Lock the state rows of ``hosts`` that no other transaction holds, ascending; their ids.
    The same statement turns ``synchronous_commit`` off for the transaction (``_flushed``
    turns it back on)."""
    quote = connections[alias].ops.quote_name
    table = quote(MaintenanceState._meta.db_table)
    column = quote(MaintenanceState._meta.get_field("host").column)
    sql = (
        f"SELECT {column}, set_config('synchronous_commit', 'off', true) FROM {table} "
        f"WHERE {column} = ANY(%s) ORDER BY {column} FOR UPDATE SKIP LOCKED"
    )
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [hosts])
        return {int(row[0]) for row in cursor.fetchall()}


def _flushed(alias: str) -> None:
    """This transaction's commit waits for its flush after all."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT set_config('synchronous_commit', 'on', true)")


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
        raise _pass_failed(host_id, exc) from None


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
