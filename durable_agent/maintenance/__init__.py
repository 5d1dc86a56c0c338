"""The maintenance core: alarm slot, due queue, mutation gate and the pass."""

from durable_agent.maintenance import alarm, failpoints, gate
from durable_agent.maintenance.due_queue import DueQueue
from durable_agent.maintenance.passes import PassReport, ensure_alarm, rearm_failure, run_pass
from durable_agent.maintenance.transactions import require_alarm_transaction, run_alarm_transaction
from durable_agent.maintenance.types import Lane

__all__ = [
    "DueQueue",
    "Lane",
    "PassReport",
    "alarm",
    "ensure_alarm",
    "failpoints",
    "gate",
    "rearm_failure",
    "require_alarm_transaction",
    "run_alarm_transaction",
    "run_pass",
]
