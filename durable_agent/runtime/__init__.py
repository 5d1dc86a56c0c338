"""The runtime protocol: what the maintenance pass needs from any runtime."""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from durable_agent import conf
from durable_agent.runtime.protocol import (
    Blocked,
    DiscoveryPage,
    RecoveryReport,
    RecoverySweep,
    Runtime,
    Settlement,
    WorkItem,
    WorkReport,
    discovers_scanned_only,
    scan_with_generation,
    stable_external_wait,
)

__all__ = [
    "Blocked",
    "DiscoveryPage",
    "RecoveryReport",
    "RecoverySweep",
    "Runtime",
    "Settlement",
    "WorkItem",
    "WorkReport",
    "discovers_scanned_only",
    "get_runtime",
    "install",
    "scan_with_generation",
    "stable_external_wait",
]

_installed: Runtime | None = None
_cache: tuple[str, Runtime] | None = None


def install(runtime: Runtime | None) -> Runtime | None:
    """Install a runtime instance for this process (tests); None restores the setting's."""
    global _installed
    previous, _installed = _installed, runtime
    return previous


def get_runtime() -> Runtime:
    """The installed runtime, else the one the ``RUNTIME`` setting names (built once)."""
    global _cache
    if _installed is not None:
        return _installed
    path = str(conf.get("RUNTIME"))
    if _cache is None or _cache[0] != path:
        target: Any = import_string(path)
        instance = target() if isinstance(target, type) else target
        if not isinstance(instance, Runtime):
            raise TypeError(f"RUNTIME {path!r} does not implement the runtime protocol")
        _cache = (path, instance)
    return _cache[1]
