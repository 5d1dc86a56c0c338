"""The lane registry: handlers for framework lanes and app-registered host lanes.

A handler is ``run(ctx) -> datetime | None``: the lane's next deadline, or None when it is idle.
It runs outside every lock; it must be idempotent (a wave may be retried after a crash) and
should return before ``ctx.deadline`` (its allowance), checking ``ctx.cancelled()`` if it loops.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from durable_agent.errors import InvalidInput
from durable_agent.maintenance import registry
from durable_agent.maintenance.lane_ids import (
    LIFECYCLE,
    MESSAGES,
    NATIVE,
    PROJECTION,
    PUBLICATION,
    RECOVERY_EVENTS,
    validate_host_lane_id,
)
from durable_agent.maintenance.passes.recovery import deliver_recovery_events
from durable_agent.maintenance.types import LaneContext

Phase = Literal["concurrent", "after-native"]

# Note [Lane phases]
#     A lane's phase names the step of a pass that runs its waves, in this one table:
#     ``BESIDE_NATIVE`` waves are admitted when the pass starts and run beside the native step
#     (one more round after it, Note [Deliver what the pass produced]); ``AFTER_NATIVE`` waves
#     run after it, one at a time, round-robin. A caught-up pass's short path runs a single
#     ``BESIDE_NATIVE`` wave at most: a due lane of any other phase takes the general path
#     (Note [Nothing or one wave to run]), and a due lane of a phase no step runs fails the
#     pass (``validate_lanes``) instead of being skipped while its slot re-arms forever. A new
#     phase is a row here, and a new step (if it needs one) in ``passes/waves.py``.
BESIDE_NATIVE = "beside-native"
AFTER_NATIVE = "after-native"
PHASES: dict[str, str] = {"concurrent": BESIDE_NATIVE, "after-native": AFTER_NATIVE}
MIN_ALLOWANCE_MS = 1
MAX_ALLOWANCE_MS = 300_000
DEFAULT_ALLOWANCE_MS = 30_000
RECOVERY_EVENT_LANE_ALLOWANCE_MS = 30_000


Handler = Callable[[LaneContext], "datetime | None"]


@dataclass(frozen=True)
class LaneSpec:
    lane: str
    run: Handler
    phase: Phase = "concurrent"
    allowance_ms: int = DEFAULT_ALLOWANCE_MS


def _idle(ctx: LaneContext) -> datetime | None:
    """The empty default of a framework lane: nothing to do."""
    return None


def step_of(spec: LaneSpec) -> str | None:
    """The step of a pass that runs ``spec``'s waves (Note [Lane phases]); None: no step does."""
    return PHASES.get(spec.phase)


def is_idle(spec: LaneSpec) -> bool:
    """Whether ``spec`` is a framework lane's empty default (no handler installed)."""
    return spec.run is _idle


_host_lanes: dict[str, LaneSpec] = {}
_framework: dict[str, LaneSpec] = {
    PUBLICATION: LaneSpec(PUBLICATION, _idle),
    PROJECTION: LaneSpec(PROJECTION, _idle),
    MESSAGES: LaneSpec(MESSAGES, _idle),
    LIFECYCLE: LaneSpec(LIFECYCLE, _idle),
}
_lock = threading.Lock()


def _spec(lane: str, run: Handler, phase: str, allowance_ms: int) -> LaneSpec:
    if not callable(run):
        raise InvalidInput(f"The handler of lane {lane!r} must be callable")
    if phase not in PHASES:
        known = " or ".join(repr(name) for name in PHASES)
        raise InvalidInput(f"A lane phase is {known}, not {phase!r}")
    if (
        isinstance(allowance_ms, bool)
        or not isinstance(allowance_ms, int)
        or not MIN_ALLOWANCE_MS <= allowance_ms <= MAX_ALLOWANCE_MS
    ):
        raise InvalidInput(
            f"A lane allowance is an int of {MIN_ALLOWANCE_MS}..{MAX_ALLOWANCE_MS} ms, "
            f"not {allowance_ms!r}"
        )
    return LaneSpec(lane, run, phase, allowance_ms)  # type: ignore[arg-type,unused-ignore]


def register(
    lane: str,
    run: Handler,
    *,
    phase: Phase = "concurrent",
    allowance_ms: int = DEFAULT_ALLOWANCE_MS,
) -> LaneSpec:
    """Register the handler of a host lane (ids outside the reserved ``agent:`` namespace).

    ``phase="concurrent"`` waves run beside the native step; ``"after-native"`` waves run after
    it, round-robin. ``allowance_ms`` (1..300000) bounds a whole wave: one that overruns fails
    the pass and is retried with backoff.
    """
    spec = _spec(validate_host_lane_id(lane), run, phase, allowance_ms)
    with _lock:
        _host_lanes[lane] = spec
    return spec


def unregister(lane: str) -> None:
    with _lock:
        _host_lanes.pop(lane, None)


def install_framework(
    lane: str,
    run: Handler | None,
    *,
    phase: Phase = "concurrent",
    allowance_ms: int = DEFAULT_ALLOWANCE_MS,
) -> None:
    """Replace the handler of a framework lane (publication, projection, messages, lifecycle).

    None restores the empty default. A publication handler other than the default keeps the
    publication barrier: native mutations then enroll the publication lane too.
    """
    if lane not in _framework:
        raise InvalidInput(f"{lane!r} is not a replaceable framework lane")
    spec = LaneSpec(lane, _idle) if run is None else _spec(lane, run, phase, allowance_ms)
    with _lock:
        _framework[lane] = spec
    if lane == PUBLICATION:
        registry.install_publication(None if run is None else run)


def handler(lane: str) -> LaneSpec | None:
    """The spec that runs ``lane``, or None (the native lane has no handler: it is the pass)."""
    if lane == NATIVE:
        return None
    if lane == RECOVERY_EVENTS:
        return LaneSpec(
            RECOVERY_EVENTS, deliver_recovery_events, "concurrent", RECOVERY_EVENT_LANE_ALLOWANCE_MS
        )
    with _lock:
        return _framework.get(lane) or _host_lanes.get(lane)


def lanes() -> list[LaneSpec]:
    """Every lane with a handler except publication (a native barrier), sorted by id."""
    with _lock:
        specs = [s for s in _framework.values() if s.lane != PUBLICATION]
        specs += list(_host_lanes.values())
    found = handler(RECOVERY_EVENTS)
    assert found is not None
    return sorted([*specs, found], key=lambda s: s.lane)


def snapshot() -> tuple[dict[str, LaneSpec], dict[str, LaneSpec]]:
    """Copies of the registrations (tests restore them)."""
    with _lock:
        return dict(_host_lanes), dict(_framework)


def restore(saved: tuple[dict[str, LaneSpec], dict[str, LaneSpec]]) -> None:
    with _lock:
        _host_lanes.clear()
        _host_lanes.update(saved[0])
        _framework.clear()
        _framework.update(saved[1])
    publication = saved[1][PUBLICATION].run
    registry.install_publication(None if publication is _idle else publication)
