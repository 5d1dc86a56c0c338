"""Ensuring a host's alarm: the O(1) constructor gate, and the parked-lane notices.

``ensure_alarm`` applies a binding registry change (``read_current_state``), registers the
framework lanes and arms the slot, without scanning the ledger; ``report_parked`` logs (and
signals) each newly parked lane once. The pass does the same first steps in its own begin
transaction (``durable_agent/maintenance/passes/run.py``).
"""

from __future__ import annotations

import logging
from datetime import datetime

from durable_agent import clock, observability, signals
from durable_agent.maintenance import backoff, failpoints
from durable_agent.maintenance.lane_ids import (
    FRAMEWORK_LANES,
    NATIVE,
    RECOVERY_EVENTS,
    public_lane_name,
)
from durable_agent.maintenance.passes import lane_registry
from durable_agent.maintenance.store.alarm import computed_deadline
from durable_agent.maintenance.store.transactions import (
    AlarmTx,
    resolve_host_id,
    run_alarm_transaction,
)
from durable_agent.maintenance.types import EPOCH, Lane
from durable_agent.models import BindingRetry, DueLane, Host
from durable_agent.runtime import Runtime, get_runtime
from durable_agent.text import duration

logger = logging.getLogger("durable_agent.maintenance")
log_extra = observability.log_extra


def read_current_state(tx: AlarmTx, runtime: Runtime) -> None:
    """Apply a binding registry change: clear parked heads and open one native opportunity."""
    key = runtime.binding_registry_key()
    if tx.state.binding_registry_key == key:
        return
    tx.state.binding_registry_key = key
    tx.clear_retry()
    BindingRetry.objects.filter(host_id=tx.host_id).delete()
    tx.state.dirty += 1
    tx.queue.dirty(NATIVE, EPOCH, progress=True)


def register_framework_lanes(tx: AlarmTx, now: datetime) -> None:
    """Give every framework lane with an installed handler its initial wave, and the
    recovery-events lane one while events wait for it."""
    for lane in FRAMEWORK_LANES:
        if lane in (NATIVE, RECOVERY_EVENTS):
            continue
        spec = lane_registry.handler(lane)
        if spec is not None and not lane_registry.is_idle(spec):
            tx.queue.register(lane)
    if tx.state.has_recovery_events and tx.queue.find(RECOVERY_EVENTS) is None:
        tx.queue.dirty(RECOVERY_EVENTS, now)


def ensure_alarm(host: Host | str | int, *, delivered: bool = False) -> datetime | None:
    """The O(1) constructor gate: registry check, lane registration and an armed slot.

    Never scans the ledger. Returns the time the slot holds afterwards. A queued delivery
    counts as armed (Note [A queued delivery holds the slot] in ``store/rows.py``), unless
    ``delivered``: the caller is that delivery and runs no pass, so it spends it first.
    """
    host_id = resolve_host_id(host)
    runtime = get_runtime()
    failpoints.hit("maintenance:ensure:before")
    now = clock.now()

    def fn(tx: AlarmTx) -> datetime | None:
        if delivered:
            tx.checkpoint.spend()
        read_current_state(tx, runtime)
        register_framework_lanes(tx, now)
        target = computed_deadline(tx, now)
        if target is not None:
            tx.checkpoint.earlier(target)
        return tx.checkpoint.target()

    slot = run_alarm_transaction(host_id, "ensure maintenance alarm", fn)
    failpoints.hit("maintenance:ensure:after")
    report_parked(host_id)
    return slot


def report_parked(host_id: int) -> int:
    """Log one notice per newly parked lane (marking it reported); never raises."""
    try:

        def fn(tx: AlarmTx) -> list[Lane]:
            return tx.queue.take_parked_reports()

        if not DueLane.objects.filter(host_id=host_id, state="parked", reported=False).exists():
            return 0
        parked = run_alarm_transaction(host_id, "report parked maintenance lanes", fn)
    except Exception:
        logger.exception(
            "Reporting parked maintenance lanes failed",
            extra=log_extra(host_id, action="report_parked"),
        )
        return 0
    for row in parked:
        logger.error(
            "Maintenance lane parked after %d attempts without progress; retrying after %s",
            backoff.MAXIMUM_NO_PROGRESS_REARMS,
            duration(backoff.PARKED_RETRY_MS),
            extra=log_extra(
                host_id, lane=public_lane_name(row.lane), lane_id=row.lane, action="lane_parked"
            ),
        )
    _signal_parked(host_id, parked)
    return len(parked)


def _signal_parked(host_id: int, parked: list[Lane]) -> None:
    """``lane_parked`` for each newly parked lane (only when a receiver is connected)."""
    if not parked or not signals.lane_parked.has_listeners(DueLane):
        return
    host = Host.objects.filter(pk=host_id).first()
    for row in parked:
        signals.send_on_commit(
            signals.lane_parked,
            sender=DueLane,
            host=host,
            lane=row.lane,
        )
