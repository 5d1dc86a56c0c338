"""The example project plus the hostile cases (tests/hostile/cases.py): the settings of the
hostile suite's live cluster. Short agent leases, so that a settlement that did not happen
would show as a second run within seconds."""

from project.settings import *  # noqa: F403
from project.settings import DURABLE_AGENT, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.hostile.apps.HostileCasesConfig"]
DURABLE_AGENT = {
    **DURABLE_AGENT,
    "AGENT_LEASE_TTL_MS": 2_000,
    "AGENT_LEASE_RENEWAL_MS": 500,
}
