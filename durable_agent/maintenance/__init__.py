"""The maintenance core: alarm slot, due queue, mutation gate and the pass (docs/architecture.md).

Its sub-packages, lowest first (each imports only the ones below it, and the shared base
modules here: ``types``, ``lane_ids``, ``backoff``, ``failpoints``, ``registry``):
``store`` (the slot, the due queue, alarm transactions, the read model),
``mutations`` (the gate), ``passes`` (the pass, its phases and what it runs),
``operators`` (audit, repairs, retention).

This package's public surface: the names below, and its modules by their short names
(``from durable_agent.maintenance import gate``).
"""

from durable_agent.maintenance import backoff, failpoints, lane_ids, passes, registry
from durable_agent.maintenance.mutations import commit_function, gate
from durable_agent.maintenance.operators import audit, repairs, retention
from durable_agent.maintenance.passes import (
    PassReport,
    ensure_alarm,
    lane_registry,
    rearm_failure,
    run_pass,
    waves,
)
from durable_agent.maintenance.passes.pool import close_thread_pool
from durable_agent.maintenance.store import alarm, selectors, transactions
from durable_agent.maintenance.store.due_queue import DueQueue
from durable_agent.maintenance.store.transactions import (
    require_alarm_transaction,
    run_alarm_transaction,
)
from durable_agent.maintenance.types import Lane

__all__ = [
    "DueQueue",
    "Lane",
    "PassReport",
    "alarm",
    "audit",
    "backoff",
    "close_thread_pool",
    "commit_function",
    "ensure_alarm",
    "failpoints",
    "gate",
    "lane_ids",
    "lane_registry",
    "passes",
    "rearm_failure",
    "registry",
    "repairs",
    "require_alarm_transaction",
    "retention",
    "run_alarm_transaction",
    "run_pass",
    "selectors",
    "transactions",
    "waves",
]
