"""Register handlers for host lanes: ``lanes.register(id, run, phase=..., allowance_ms=...)``."""

from durable_agent.maintenance.passes.lane_registry import (
    LaneSpec,
    install_framework,
    register,
    unregister,
)
from durable_agent.maintenance.types import LaneContext

__all__ = ["LaneContext", "LaneSpec", "install_framework", "register", "unregister"]
