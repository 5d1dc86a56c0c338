"""durable_agent: durable agent threads for Django, kept alive by one durable alarm per host.

Importing this package touches no models and no settings: ``agent``, ``submit``, ``abort``,
``approve``, ``resolve_unknown``, ``wait`` and ``RetryPolicy`` are imported from
``durable_agent.agents`` on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durable_agent.agents.registry import agent
    from durable_agent.agents.retry_policy import RetryPolicy
    from durable_agent.agents.services import abort, approve, resolve_unknown, submit
    from durable_agent.agents.waiting import wait

__version__ = "0.1.0.dev0"

_EXPORTS = {
    "agent": "durable_agent.agents.registry",
    "submit": "durable_agent.agents.services",
    "abort": "durable_agent.agents.services",
    "approve": "durable_agent.agents.services",
    "resolve_unknown": "durable_agent.agents.services",
    "wait": "durable_agent.agents.waiting",
    "RetryPolicy": "durable_agent.agents.retry_policy",
}

__all__ = [
    "RetryPolicy",
    "__version__",
    "abort",
    "agent",
    "approve",
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
