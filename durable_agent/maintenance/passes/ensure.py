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
from durable_agent.maintenance.lanes import lane_registry
from durable_agent.maintenance.store.alarm import clear_retry, computed_deadline
from durable_agent.maintenance.store.due_queue import DueQueue
from durable_agent.maintenance.store.transactions import resolve_host_id, run_alarm_transaction
from durable_agent.maintenance.types import EPOCH, Checkpoint, Lane
from durable_agent.models import BindingRetry, DueLane, Host, MaintenanceState
from durable_agent.runtime import Runtime, get_runtime
from durable_agent.text import duration

logger = logging.getLogger("durable_agent.maintenance")
log_extra = observability.log_extra


def read_current_state(state: MaintenanceState, queue: DueQueue, runtime: Runtime) -> None:
    """Apply a binding registry change: clear parked heads and open one native opportunity."""
    key = runtime.binding_registry_key()
    if state.binding_registry_key == key:
        return
    state.binding_registry_key = key
    clear_retry(state)
    BindingRetry.objects.filter(host_id=state.host_id).delete()
    state.dirty += 1
    queue.dirty(NATIVE, EPOCH, progress=True)


def register_framework_lanes(queue: DueQueue) -> None:
    """Give every framework lane with an installed handler its initial wave."""
    for lane in FRAMEWORK_LANES:
        if lane in (NATIVE, RECOVERY_EVENTS):
            continue
        spec = lane_registry.handler(lane)
        if spec is not None and not lane_registry.is_idle(spec):
            queue.register(lane)


def ensure_alarm(host: Host | str | int) -> datetime | None:
    """The O(1) constructor gate: registry check, lane registration and an armed slot.

    Never scans the ledger. Returns the time the slot holds afterwards.
    """
    host_id = resolve_host_id(host)
    runtime = get_runtime()
    failpoints.hit("maintenance:ensure:before")
    now = clock.now()

    def fn(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> datetime | None:
        read_current_state(state, queue, runtime)
        register_framework_lanes(queue)
        if state.has_recovery_events and queue.find(RECOVERY_EVENTS) is None:
            queue.dirty(RECOVERY_EVENTS, now)
        target = computed_deadline(state, queue, now)
        if target is not None:
            checkpoint.earlier(target)
        return checkpoint.target()

    slot = run_alarm_transaction(host_id, "ensure maintenance alarm", fn)
    failpoints.hit("maintenance:ensure:after")
    report_parked(host_id)
    return slot


def report_parked(host_id: int) -> int:
    """Log one notice per newly parked lane (marking it reported); never raises."""
    try:

        def fn(state: MaintenanceState, queue: DueQueue, checkpoint: Checkpoint) -> list[Lane]:
            return queue.take_parked_reports()

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
