"""Lane ids: the reserved framework lanes and the rules for host lanes (docs/concepts.md)."""

from __future__ import annotations

import pytest

from durable_agent.errors import InvalidInput, InvalidLaneId
from durable_agent.maintenance import lane_ids

FRAMEWORK = [
    "agent:native",
    "agent:publication",
    "agent:projection",
    "agent:messages",
    "agent:recovery-events",
    "agent:lifecycle",
]
INVALID_HOST_LANES = [
    pytest.param("", id="empty"),
    pytest.param("x" * 257, id="257-chars"),
    pytest.param("out box", id="space"),
    pytest.param("out/box", id="slash"),
    pytest.param("outbox\n", id="trailing-newline"),
    pytest.param("out\tbox", id="tab"),
    pytest.param("outbóx", id="non-ascii"),
    pytest.param("agent:custom", id="reserved-prefix"),
    pytest.param("agent:", id="bare-reserved-prefix"),
    pytest.param("agent:native-extra", id="reserved-prefix-near-framework-id"),
    pytest.param(None, id="none"),
    pytest.param(42, id="int"),
    pytest.param(b"outbox", id="bytes"),
]


def test_framework_lanes__are_the_six_reserved_ids() -> None:
    assert list(lane_ids.FRAMEWORK_LANES) == FRAMEWORK
    assert lane_ids.NATIVE == "agent:native"
    assert lane_ids.PUBLICATION == "agent:publication"
    assert lane_ids.PROJECTION == "agent:projection"
    assert lane_ids.MESSAGES == "agent:messages"
    assert lane_ids.RECOVERY_EVENTS == "agent:recovery-events"
    assert lane_ids.LIFECYCLE == "agent:lifecycle"


@pytest.mark.parametrize(
    "lane",
    ["outbox", "a", "x" * 256, "A-Za-z0-9_.:-", "tenant.42:mail_out", "effect-agent:native"],
)
def test_validate_host_lane_id__accepts_one_to_256_allowed_characters(lane: str) -> None:
    assert lane_ids.validate_host_lane_id(lane) == lane
    assert lane_ids.validate_lane_id(lane) == lane


@pytest.mark.parametrize("lane", INVALID_HOST_LANES)
def test_validate_host_lane_id__rejects_invalid_ids(lane: object) -> None:
    with pytest.raises(InvalidLaneId) as excinfo:
        lane_ids.validate_host_lane_id(lane)
    assert isinstance(excinfo.value, InvalidInput)


@pytest.mark.parametrize("lane", INVALID_HOST_LANES)
def test_validate_lane_id__rejects_invalid_ids(lane: object) -> None:
    with pytest.raises(InvalidLaneId):
        lane_ids.validate_lane_id(lane)


@pytest.mark.parametrize("lane", FRAMEWORK)
def test_validate_lane_id__accepts_framework_ids(lane: str) -> None:
    assert lane_ids.validate_lane_id(lane) == lane


@pytest.mark.parametrize("lane", FRAMEWORK)
def test_validate_host_lane_id__rejects_framework_ids(lane: str) -> None:
    with pytest.raises(InvalidLaneId, match="reserved"):
        lane_ids.validate_host_lane_id(lane)


@pytest.mark.parametrize(
    ("lane", "expected"),
    [
        ("agent:native", "native"),
        ("agent:publication", "publication"),
        ("agent:projection", "projection"),
        ("agent:messages", "messages"),
        ("agent:recovery-events", "recovery-events"),
        ("agent:lifecycle", "lifecycle"),
        ("outbox", "host"),
        ("effect-agent:native", "host"),
    ],
)
def test_public_lane_name__strips_the_prefix_of_framework_lanes_only(
    lane: str, expected: str
) -> None:
    assert lane_ids.public_lane_name(lane) == expected
