"""The maintenance core: alarm slot, due queue, mutation gate (and, on top, the pass)."""

from durable_agent.maintenance import alarm, failpoints, gate
from durable_agent.maintenance.due_queue import DueQueue, Lane
from durable_agent.maintenance.transactions import require_alarm_transaction, run_alarm_transaction

__all__ = [
    "DueQueue",
    "Lane",
    "alarm",
    "failpoints",
    "gate",
    "require_alarm_transaction",
    "run_alarm_transaction",
]
