"""The alarm slot: one django-q ``Schedule`` row per host (docs/concepts.md).

Armed is ``repeats=1`` with ``next_run`` = the deadline; disarmed is ``repeats=0``. A ONCE
schedule with ``repeats=-1`` is deleted when it fires, so -1 is never used. The three checkpoint
operations, ``at`` (replace), ``earlier`` (keep the earlier) and ``cancel`` (disarm), are
intents recorded inside an alarm transaction; the last one wins and is applied just before the
transaction commits, together with the facts and lanes it belongs to.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from durable_agent import clock, conf, signals
from durable_agent.errors import HostNotFound, InvalidInput, RearmRefused
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.maintenance.store.rows import slot_deadline
from durable_agent.maintenance.store.transactions import (
    AlarmTx,
    resolve_host_id,
    run_alarm_transaction,
)
from durable_agent.maintenance.types import validate_deadline
from durable_agent.models import AlarmAudit, Host
from durable_agent.text import check_text, is_blank, validate_reason


def scheduled(host: Host | str | int) -> datetime | None:
    """The time the host's slot holds (None when disarmed). Read-only."""
    row = Host.objects.select_related("alarm").filter(pk=resolve_host_id(host)).first()
    if row is None:
        raise HostNotFound(f"No host {host!r}", host=host)
    return slot_deadline(row.alarm)


def computed_deadline(tx: AlarmTx, now: datetime) -> datetime | None:
    """Recompute the slot from the state and the lanes (the ``ensure_alarm`` rule).

    A dirty generation owes the native lane a deadline (its durable backoff floor when one
    matches, else its own deadline, else now); the slot is then the earliest lane deadline,
    never sooner than the minimum alarm delay.
    """
    if tx.state.dirty > tx.state.processed:
        native_row = tx.queue.find(NATIVE)
        retry_at = tx.retry_deadline()
        if retry_at is not None:
            native: datetime | None = retry_at
        elif native_row is not None and native_row.due_at is not None:
            native = native_row.due_at
        else:
            native = now + conf.minimum_alarm_delay()
    else:
        native = None
    tx.queue.checkpoint_native(native)
    return tx.earliest_slot(now)


def _actor_name(actor: Any) -> str:
    if actor is None:
        return "system"
    name = str(actor.get_username() if hasattr(actor, "get_username") else actor)
    if is_blank(name):
        raise InvalidInput("An actor must have a name")
    return check_text(name, what="actor")[:200]


def rearm(
    host: Host | str | int,
    at: datetime | None = None,
    actor: Any = None,
    reason: str = "",
) -> datetime | None:
    """Recompute the slot from the queue (or set ``at``) and write an :class:`AlarmAudit` row.

    Args:
        host: the host (a Host, its key or its id).
        at: an explicit aware time; refused with :class:`RearmRefused` when work is already due
            earlier than it (the slot must always hold the earliest deadline).
        actor: who asked (a user, a token name or a string); "system" when None.
        reason: free text kept (whitespace trimmed) in the audit row; see
            :func:`durable_agent.text.validate_reason`.

    Returns:
        The time the slot now holds, or None when nothing is due and the slot was disarmed.
    """
    if at is not None:
        at = validate_deadline(at, name="at")
    reason = validate_reason(reason)
    actor_name = _actor_name(actor)

    def fn(tx: AlarmTx) -> datetime | None:
        now = clock.now()
        state, checkpoint = tx.state, tx.checkpoint
        old = checkpoint.current
        computed = computed_deadline(tx, now)
        if at is None:
            new = computed
        elif computed is not None and at > computed:
            raise RearmRefused(
                "rearm maintenance alarm",
                f"{at.isoformat()} would postpone work due at {computed.isoformat()}; "
                "choose a time no later than that, or omit it to recompute",
                computed=computed,
                requested=at,
            )
        else:
            new = at
        if new is None:
            checkpoint.cancel()
        else:
            checkpoint.at(new)
        audit = AlarmAudit.objects.create(
            host_id=state.host_id,
            actor=actor_name,
            action="rearm",
            reason=reason,
            old_deadline=old,
            new_deadline=new,
            generation=state.dirty,
            detail={
                "requested": at.isoformat() if at else None,
                "computed": computed.isoformat() if computed else None,
            },
            at=now,
        )
        signals.send_on_commit(
            signals.alarm_rearmed,
            sender=Host,
            host=state.host,
            old_deadline=old,
            new_deadline=new,
            audit=audit,
        )
        signals.send_on_commit(
            signals.repair_performed, sender=AlarmAudit, host=state.host, audit=audit
        )
        return new

    return run_alarm_transaction(host, "rearm maintenance alarm", fn)
