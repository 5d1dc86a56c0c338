"""The django-health-check backend."""

from __future__ import annotations

from datetime import timedelta

import pytest
from health_check.exceptions import ServiceUnavailable, ServiceWarning

from durable_agent.contrib.health_checks import Fleet
from durable_agent.maintenance import alarm
from durable_agent.models import DueLane, Host, PassRecord
from durable_agent.testing import FakeClock
from tests.factories import HostFactory

pytestmark = pytest.mark.django_db


def test_fleet__healthy(host: Host, clock: FakeClock) -> None:
    Fleet().run()


def test_fleet__a_parked_lane_is_a_warning(host: Host, clock: FakeClock) -> None:
    DueLane.objects.create(host=host, lane="stuck", state="parked", stalls=8, due_at=None)
    with pytest.raises(ServiceWarning, match="1 lane"):
        Fleet().run()


def test_fleet__overdue_and_failing_hosts_are_unavailable(host: Host, clock: FakeClock) -> None:
    alarm.rearm(host, at=clock.now() - timedelta(minutes=5), actor="t", reason="arm")
    failing = HostFactory(key="failing")
    for n in range(3):  # FAILING_AFTER_PASSES failed passes in a row
        PassRecord.objects.create(
            host=failing, started_at=clock.now() - timedelta(seconds=n), phase="failed", error="x"
        )
    with pytest.raises(ServiceUnavailable, match=r"1 host\(s\) overdue, 1 host\(s\) failing"):
        Fleet().run()
    PassRecord.objects.create(
        host=failing, started_at=clock.now() + timedelta(seconds=1), phase="caught-up"
    )
    with pytest.raises(ServiceUnavailable, match=r"^Unavailable: 1 host\(s\) overdue$"):
        Fleet().run()
