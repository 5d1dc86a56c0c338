"""The reference runtime: agent registry, ledger services, leases and recovery.

Importing this package touches no models; each name below is imported on first access.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durable_agent.agents.context import AgentContext, ApprovalRequested
    from durable_agent.agents.registry import AgentSpec, agent, registry_key
    from durable_agent.agents.retry_policy import RetryPolicy
    from durable_agent.agents.runtime import ReferenceRuntime
    from durable_agent.agents.services import (
        MAX_PAYLOAD_BYTES,
        Receipt,
        SubmissionStatus,
        abort,
        approve,
        resolve_unknown,
        submit,
    )
    from durable_agent.agents.waiting import wait

_EXPORTS = {
    "AgentContext": "durable_agent.agents.context",
    "ApprovalRequested": "durable_agent.agents.context",
    "AgentSpec": "durable_agent.agents.registry",
    "agent": "durable_agent.agents.registry",
    "registry_key": "durable_agent.agents.registry",
    "ReferenceRuntime": "durable_agent.agents.runtime",
    "MAX_PAYLOAD_BYTES": "durable_agent.agents.services",
    "Receipt": "durable_agent.agents.services",
    "SubmissionStatus": "durable_agent.agents.services",
    "abort": "durable_agent.agents.services",
    "approve": "durable_agent.agents.services",
    "resolve_unknown": "durable_agent.agents.services",
    "submit": "durable_agent.agents.services",
    "wait": "durable_agent.agents.waiting",
    "RetryPolicy": "durable_agent.agents.retry_policy",
}

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "AgentContext",
    "AgentSpec",
    "ApprovalRequested",
    "Receipt",
    "ReferenceRuntime",
    "RetryPolicy",
    "SubmissionStatus",
    "abort",
    "agent",
    "approve",
    "registry_key",
    "resolve_unknown",
    "submit",
    "wait",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
