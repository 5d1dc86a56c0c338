"""Lane identifiers: the reserved framework lanes and the rules for host lanes."""

from __future__ import annotations

import re

from durable_agent.errors import InvalidLaneId

RESERVED_PREFIX = "agent:"
NATIVE = "agent:native"
PUBLICATION = "agent:publication"
PROJECTION = "agent:projection"
MESSAGES = "agent:messages"
RECOVERY_EVENTS = "agent:recovery-events"
LIFECYCLE = "agent:lifecycle"
FRAMEWORK_LANES = (NATIVE, PUBLICATION, PROJECTION, MESSAGES, RECOVERY_EVENTS, LIFECYCLE)

MAX_LANE_ID_LENGTH = 256
_LANE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,256}")


def validate_host_lane_id(lane: object) -> str:
    """Return ``lane`` if it is a valid host lane id, else raise :class:`InvalidLaneId`."""
    if not isinstance(lane, str):
        raise InvalidLaneId(f"A lane id must be a string, not {type(lane).__name__}", lane=lane)
    if not lane:
        raise InvalidLaneId("A lane id must not be empty", lane=lane)
    if len(lane) > MAX_LANE_ID_LENGTH:
        raise InvalidLaneId(
            f"A lane id has at most {MAX_LANE_ID_LENGTH} characters, not {len(lane)}", lane=lane
        )
    if not _LANE_ID.fullmatch(lane):
        raise InvalidLaneId(
            f"A lane id uses only the characters [A-Za-z0-9_.:-]: {lane[:64]!r}", lane=lane
        )
    if lane.startswith(RESERVED_PREFIX):
        raise InvalidLaneId(
            f"The {RESERVED_PREFIX} namespace is reserved for framework maintenance lanes: "
            f"{lane!r}",
            lane=lane,
        )
    return lane


def validate_lane_id(lane: object) -> str:
    """Return ``lane`` if it is a framework lane id or a valid host lane id."""
    if isinstance(lane, str) and lane in FRAMEWORK_LANES:
        return lane
    return validate_host_lane_id(lane)


def public_lane_name(lane: str) -> str:
    """The name a parked notice reports: the framework id without its prefix, else "host"."""
    return lane.removeprefix(RESERVED_PREFIX) if lane in FRAMEWORK_LANES else "host"
