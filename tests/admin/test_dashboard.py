from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from durable_agent.maintenance import gate
from durable_agent.models import Host, PassRecord
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.admin.helpers import changelist, fail_recovery, park, wait_for_binding
from tests.factories import HostFactory, PassRecordFactory
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/durable_agent/host/dashboard/"


def _count(html: str, name: str) -> int:
    marker = f'data-count="{name}">'
    start = html.index(marker) + len(marker)
    return int(html[start : html.index("<", start)])


def test_dashboard__counts_timeline_histogram_and_lists(
    viewer_client: Client, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    late = HostFactory(key="late-host")
    caught_up(late)
    gate.schedule(late, "outbox", clock.now())
    clock.advance(minutes=2)
    parked = HostFactory(key="parked-host")
    park(parked, clock)
    faulted = HostFactory(key="faulted-host")
    fail_recovery(faulted, runtime)
    waiting = HostFactory(key="waiting-host")
    wait_for_binding(waiting, runtime)
    soon = HostFactory(key="soon-host")
    caught_up(soon)
    gate.schedule(soon, "outbox", clock.now() + timedelta(minutes=3))
    for lateness in (-5, 40, 40, 300, 7_000):
        PassRecordFactory(host=soon, started_at=clock.now(), lateness_ms=lateness)

    response = viewer_client.get(DASHBOARD)

    assert response.status_code == 200
    html = response.content.decode()
    assert _count(html, "hosts") == 5
    assert _count(html, "overdue") == 1
    assert _count(html, "parked") == 1
    assert _count(html, "faulted") == 1
    assert _count(html, "binding") == 1
    timeline = html[html.index('id="da-timeline"') : html.index('id="da-lateness"')]
    assert "<svg" in timeline
    assert timeline.count('class="da-mark da-mark-') == 4  # every armed slot (waiting: none)
    assert 'class="da-mark da-mark-overdue"' in timeline
    assert "late-host" in timeline
    assert "soon-host" in timeline
    assert ">now</text>" in timeline
    lateness = html[html.index('id="da-lateness"') :]
    assert "<svg" in lateness
    bars = response.context["dashboard"].histogram.bars
    by_services = PassRecord.objects.filter(lateness_ms__gte=0, lateness_ms__lt=100).count() - 2
    assert [bar.count for bar in bars][:5] == [1, 2 + by_services, 0, 1, 0]
    assert bars[7].count == 1  # 7 s: the 5-10 s bin
    lists = html[html.index('id="da-overdue-list"') :]
    for key in ("late-host", "parked-host", "faulted-host"):
        assert key in lists
    assert "<script" not in timeline + lateness  # no JS: plain SVG


def test_dashboard__empty(viewer_client: Client, db: None) -> None:
    html = viewer_client.get(DASHBOARD).content.decode()
    assert "No host has an armed alarm" in html
    assert "No pass fired by an alarm has been recorded yet" in html
    assert _count(html, "hosts") == 0


def test_dashboard__constant_queries(viewer_client: Client, clock: FakeClock) -> None:
    def populate(n: int) -> None:
        for _ in range(n):
            host = HostFactory()
            caught_up(host)
            gate.schedule(host, "outbox", clock.now() + timedelta(seconds=5))
            PassRecordFactory(host=host, started_at=clock.now(), lateness_ms=20)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert viewer_client.get(DASHBOARD).status_code == 200
        return len(captured)

    populate(1)
    one = queries()
    populate(40)
    assert queries() == one


def test_dashboard__linked_from_the_host_list_and_the_app_index(viewer_client: Client) -> None:
    assert DASHBOARD in viewer_client.get(changelist("host")).content.decode()
    assert DASHBOARD in viewer_client.get("/admin/durable_agent/").content.decode()


def test_dashboard__needs_the_view_permission(client: Client, db: None) -> None:
    nobody = User.objects.create_user("nobody", password="pw", is_staff=True)
    client.force_login(nobody)
    assert client.get(DASHBOARD).status_code == 403
    client.logout()
    response = client.get(DASHBOARD)
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_dashboard__a_host_viewer_sees_maintenance_rows(client: Client, host: Host) -> None:
    """view_host alone opens the host's lanes, retries, faults, audits and passes."""
    from django.contrib.auth.models import Permission

    user = User.objects.create_user("hostonly", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_host"))
    client.force_login(user)
    for model in ("duelane", "bindingretry", "recoveryfault", "alarmaudit", "passrecord"):
        assert client.get(changelist(model)).status_code == 200
    assert client.get(changelist("submission")).status_code == 403  # payloads stay private
