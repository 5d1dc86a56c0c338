"""Operator repairs: each one is a service, runs in one alarm transaction and is audited.

The admin, the API and the commands call these; nothing else writes an ``AlarmAudit`` row
except ``alarm.rearm``. Every repair leaves the invariant true: work it releases advances the
generation or its lane and re-arms the slot in the same commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from durable_agent import clock, signals
from durable_agent.errors import InvalidInput
from durable_agent.maintenance import passes
from durable_agent.maintenance.lane_ids import NATIVE, validate_lane_id
from durable_agent.maintenance.store.alarm import _actor_name
from durable_agent.maintenance.store.transactions import AlarmTx, run_alarm_transaction
from durable_agent.models import (
    AlarmAudit,
    BindingRetry,
    DueLane,
    Host,
    RecoveryFault,
)
from durable_agent.text import check_text, validate_reason


class NotRepairable(InvalidInput):
    """The object is not in a state this repair applies to; nothing was changed."""

    code = "not_repairable"


class RepairTargetNotFound(InvalidInput, LookupError):
    """The lane, binding retry or fault to repair does not exist on this host."""

    code = "repair_target_not_found"


@dataclass(frozen=True)
class RepairResult:
    """What a repair did: the audit row written and the slot afterwards."""

    host: str
    action: str
    audit_id: int
    alarm: datetime | None


def _audit(
    tx: AlarmTx,
    *,
    action: str,
    actor: str,
    reason: str,
    now: datetime,
    detail: dict[str, Any],
) -> AlarmAudit:
    state, checkpoint = tx.state, tx.checkpoint
    old = checkpoint.current
    audit = AlarmAudit.objects.create(
        host_id=tx.host_id,
        actor=actor,
        action=action,
        reason=reason,
        old_deadline=old,
        new_deadline=checkpoint.target(),
        generation=state.dirty,
        detail=detail,
        at=now,
    )
    signals.send_on_commit(
        signals.repair_performed, sender=AlarmAudit, host=state.host, audit=audit
    )
    return audit


def _native_opportunity(tx: AlarmTx, now: datetime) -> None:
    """Released native work: advance the generation, enroll the native lane, arm the slot."""
    tx.state.dirty += 1
    tx.queue.dirty(NATIVE, now, progress=True)
    tx.pull_to_earliest(now)


def _run(host: Host | str | int, operation: str, fn: Any) -> RepairResult:
    result: RepairResult = run_alarm_transaction(host, operation, fn)
    return result


def lane_unpark(
    *, host: Host | str | int, lane: str, actor: Any = None, reason: str = ""
) -> RepairResult:
    """Give a parked lane a fresh budget, due now (the next pass may claim it)."""
    lane = validate_lane_id(lane)
    reason = validate_reason(reason)
    actor_name = _actor_name(actor)
    now = clock.now()

    def fn(tx: AlarmTx) -> RepairResult:
        row = tx.queue.find(lane)
        if row is None:
            raise RepairTargetNotFound(f"No lane {lane!r} on this host", lane=lane)
        if not row.parked:
            raise NotRepairable(f"Lane {lane!r} is {row.state}, not parked", lane=lane)
        tx.queue.dirty(lane, now, progress=True)
        tx.pull_to_earliest(now)
        audit = _audit(
            tx,
            action="unpark",
            actor=actor_name,
            reason=reason,
            now=now,
            detail={"lane": lane, "stalls": row.stalls, "revision": row.revision},
        )
        signals.send_on_commit(
            signals.lane_unparked,
            sender=DueLane,
            host=tx.state.host,
            lane=lane,
            audit=audit,
        )
        return RepairResult(tx.state.host.key, "unpark", audit.pk, tx.checkpoint.target())

    return _run(host, "unpark maintenance lane", fn)


def binding_retry_now(
    *, host: Host | str | int, retry_id: int, actor: Any = None, reason: str = ""
) -> RepairResult:
    """Release a binding-parked head for one more attempt (one native opportunity)."""
    reason = validate_reason(reason)
    actor_name = _actor_name(actor)
    now = clock.now()

    def fn(tx: AlarmTx) -> RepairResult:
        retry = BindingRetry.objects.filter(host_id=tx.state.host_id, pk=retry_id).first()
        if retry is None:
            raise RepairTargetNotFound(f"No binding retry {retry_id} on this host")
        detail = {
            "thread": retry.thread,
            "submission": retry.submission,
            "attempts": retry.attempts,
            "registry_key": retry.registry_key,
        }
        retry.delete()
        _native_opportunity(tx, now)
        audit = _audit(
            tx,
            action="retry-binding",
            actor=actor_name,
            reason=reason,
            now=now,
            detail=detail,
        )
        return RepairResult(tx.state.host.key, "retry-binding", audit.pk, tx.checkpoint.target())

    return _run(host, "retry binding wait", fn)


def fault_retry_now(
    *, host: Host | str | int, thread: str, actor: Any = None, reason: str = ""
) -> RepairResult:
    """Retry a thread's failed recovery now instead of at its scheduled retry time."""
    if not isinstance(thread, str) or not thread:
        raise InvalidInput("A thread must be a non-empty string")
    check_text(thread, what="thread key")
    reason = validate_reason(reason)
    actor_name = _actor_name(actor)
    now = clock.now()

    def fn(tx: AlarmTx) -> RepairResult:
        fault = RecoveryFault.objects.filter(host_id=tx.state.host_id, thread=thread).first()
        if fault is None:
            raise RepairTargetNotFound(f"No recovery fault for thread {thread!r} on this host")
        detail = {
            "thread": thread,
            "attempts": fault.attempts,
            "retry_at": fault.retry_at.isoformat(),
        }
        fault.retry_at = now
        fault.save(update_fields=["retry_at"])
        _native_opportunity(tx, now)
        audit = _audit(
            tx,
            action="retry-fault",
            actor=actor_name,
            reason=reason,
            now=now,
            detail=detail,
        )
        return RepairResult(tx.state.host.key, "retry-fault", audit.pk, tx.checkpoint.target())

    return _run(host, "retry recovery fault", fn)


def pass_now(*, host: Host | str | int, actor: Any = None, reason: str = "") -> Any:
    """Audit, then run a maintenance pass of ``host`` at once; returns its PassReport."""
    reason = validate_reason(reason)
    actor_name = _actor_name(actor)
    now = clock.now()

    def fn(tx: AlarmTx) -> None:
        _audit(tx, action="pass", actor=actor_name, reason=reason, now=now, detail={})

    run_alarm_transaction(host, "audit maintenance pass", fn)
    return passes.run_pass(host)  # looked up at call time: a replaced run_pass is the one run
