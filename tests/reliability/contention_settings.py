"""The example project plus the contention test's agent: the settings of its live cluster."""

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.reliability.contention_agents.ContentionAgentsConfig"]
