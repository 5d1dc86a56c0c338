"""Each installed app's ``agents.py`` and ``lanes.py`` are imported when Django starts."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import override_settings

from durable_agent.agents import registry
from durable_agent.maintenance import lane_registry


@pytest.fixture
def fresh_registries() -> Iterator[None]:
    saved_agents, saved_lanes = registry.snapshot(), lane_registry.snapshot()
    registry.restore({})
    for name in ("tests.autodiscovered.agents", "tests.autodiscovered.lanes"):
        sys.modules.pop(name, None)
    yield
    registry.restore(saved_agents)
    lane_registry.restore(saved_lanes)


def test_autodiscovery__an_installed_apps_agents_and_lanes_register(fresh_registries: None) -> None:
    assert registry.lookup("autodiscovered", "1") is None
    assert lane_registry.handler("autodiscovered") is None
    with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, "tests.autodiscovered"]):
        assert registry.lookup("autodiscovered", "1") is not None
        assert lane_registry.handler("autodiscovered") is not None
