"""Register handlers for host lanes: ``lanes.register(id, run, phase=..., allowance_ms=...)``."""

from durable_agent.maintenance.lane_registry import (
    LaneContext,
    LaneSpec,
    install_framework,
    register,
    unregister,
)

__all__ = ["LaneContext", "LaneSpec", "install_framework", "register", "unregister"]
