"""The recovery-events lane: deliver each recovery event, in order, to ``recovery_fault``.

The events are appended by native recovery (``recovery.py``); this lane delivers them at least
once and acknowledges each in an alarm transaction (docs/pass.md).
"""

from __future__ import annotations

from datetime import datetime

from durable_agent import clock
from durable_agent.maintenance.store.transactions import AlarmTx, run_alarm_transaction
from durable_agent.maintenance.types import LaneContext
from durable_agent.models import MaintenanceState, RecoveryEvent
from durable_agent.signals import recovery_fault


def deliver_recovery_events(ctx: LaneContext) -> datetime | None:
    """The recovery-events lane: send each undelivered event to ``recovery_fault``, in order."""
    host = ctx.host
    while not ctx.cancelled():
        state = MaintenanceState.objects.get(host_id=host.pk)
        sequence = state.recovery_event_acknowledged + 1
        if sequence > state.recovery_event_sequence:
            return None
        event = RecoveryEvent.objects.get(host_id=host.pk, sequence=sequence)
        recovery_fault.send(sender=RecoveryEvent, host=host, event=event)
        delivered_at = clock.now()

        def ack(
            tx: AlarmTx, sequence: int = sequence, delivered_at: datetime = delivered_at
        ) -> None:
            if tx.state.recovery_event_acknowledged < sequence:
                tx.state.recovery_event_acknowledged = sequence
                RecoveryEvent.objects.filter(host_id=host.pk, sequence=sequence).update(
                    delivered_at=delivered_at
                )

        run_alarm_transaction(host, "acknowledge recovery event", ack)
    return ctx.now()
