"""The durable_agent admin: hosts, their maintenance rows, the ledger and the dashboard.

Read-only everywhere; repairs are actions that call services (each writes one audit row) and
need the ``durable_agent.repair_host`` permission. See docs/admin.md.
"""

from durable_agent.admin import hosts, ledger, parts

__all__ = ["hosts", "ledger", "parts"]
