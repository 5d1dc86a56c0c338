from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client

from durable_agent.maintenance import alarm, gate, run_pass
from durable_agent.models import Host
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.admin.helpers import fail_recovery, host_page, park, wait_for_binding
from tests.factories import (
    AlarmAuditFactory,
    DueLaneFactory,
    HostFactory,
    MutationTicketFactory,
    RecoveryEventFactory,
    SubmissionFactory,
    ThreadFactory,
    WorkCursorFactory,
)
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db


def _section(html: str, section: str) -> str:
    start = html.index(f'id="da-{section}"')
    return html[start : html.index('<div class="module', start + 1)]


def _lane_row(html: str, lane: str) -> str:
    start = html.rindex("<tr", 0, html.index(f'data-lane="{lane}"'))
    return html[start : html.index("</tr>", start)]


def test_host_page__marks_the_lane_that_sets_the_alarm(
    viewer_client: Client, host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    gate.schedule(host, "later", clock.now() + timedelta(minutes=5))
    gate.schedule(host, "sooner", clock.now() + timedelta(seconds=30))
    DueLaneFactory(host=host, lane="idle", due_at=None, state="idle")

    html = viewer_client.get(host_page(host)).content.decode()

    lanes = _section(html, "lanes")
    assert lanes.count("sets the alarm") == 1
    assert "sets the alarm" in _lane_row(lanes, "sooner")
    assert "da-sets-alarm" in _lane_row(lanes, "sooner")
    assert "sets the alarm" not in _lane_row(lanes, "later")
    assert "idle" in _lane_row(lanes, "idle")
    assert "2030-01-01 00:00:30 UTC" in _lane_row(lanes, "sooner")
    assert "in 30 s" in _lane_row(lanes, "sooner")
    assert alarm.scheduled(host) == clock.now() + timedelta(seconds=30)
    assert "2030-01-01 00:00:30 UTC" in html  # the slot fact
    assert re.search(r"Invariant</th><td[^>]*>holds", html)


def test_host_page__shows_every_section(
    viewer_client: Client, host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    park(host, clock)
    wait_for_binding(host, runtime, thread="waiting")
    fail_recovery(host, runtime, thread="broken")
    MutationTicketFactory(host=host, lanes=["outbox"], created_at=clock.now())
    MutationTicketFactory(host=host, created_at=clock.now() - timedelta(minutes=5))  # expired
    WorkCursorFactory(host=host, thread="paged", cursor="page-7")
    RecoveryEventFactory(host=host, sequence=41, thread="evented")
    AlarmAuditFactory(host=host, actor="alice", reason="because", action="rearm", at=clock.now())

    html = viewer_client.get(host_page(host)).content.decode()

    assert "parked" in _lane_row(_section(html, "lanes"), "outbox")
    assert "Lanes (3, 1 parked)" in html
    assert "Live mutation tickets (1)" in html
    assert "1 expired ticket" in html
    assert "waiting" in _section(html, "binding-retries")
    assert "page-7" in _section(html, "cursors")
    assert "broken" in _section(html, "faults")
    assert "db down" in _section(html, "faults")
    assert "evented" in _section(html, "events")
    passes = _section(html, "passes")
    assert passes.count("<tr") == 1 + 10  # header + the passes so far
    assert "actionable" in passes
    audit = html[html.index('id="da-audit"') :]
    assert "alice" in audit
    assert "because" in audit


def test_host_page__buttons_only_for_repairers(
    viewer_client: Client,
    operator_client: Client,
    host: Host,
    clock: FakeClock,
    runtime: ScriptedRuntime,
) -> None:
    park(host, clock)
    wait_for_binding(host, runtime)
    fail_recovery(host, runtime)

    as_viewer = viewer_client.get(host_page(host)).content.decode()
    as_operator = operator_client.get(host_page(host)).content.decode()

    for action in (
        "rearm_now",
        "rearm_at",
        "run_pass_now",
        "unpark_lanes",
        "retry_bindings",
        "retry_faults",
    ):
        assert f'data-action="{action}"' in as_operator
        assert f'data-action="{action}"' not in as_viewer
    assert "You can view this host but not repair it" in as_viewer
    assert 'name="_save"' not in as_operator  # read-only: nothing to save


def test_host_page__read_only_for_everyone(operator_client: Client, host: Host) -> None:
    response = operator_client.post(host_page(host), {"key": "renamed", "single_thread": "on"})
    assert response.status_code == 403
    host.refresh_from_db()
    assert host.key != "renamed"
    add = operator_client.get("/admin/durable_agent/host/add/")
    assert add.status_code == 403
    delete = operator_client.post(f"/admin/durable_agent/host/{host.pk}/delete/", {"post": "yes"})
    assert delete.status_code == 403
    assert Host.objects.filter(pk=host.pk).exists()


def test_host_page__a_host_without_state(viewer_client: Client) -> None:
    host = HostFactory(key="brand-new")
    html = viewer_client.get(host_page(host)).content.decode()
    assert "dirty 1 / processed 0" in html
    assert "no state row yet" in html
    assert "No lanes yet" in html


def test_host_page__a_failed_pass_is_shown(
    viewer_client: Client, host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    runtime.submit(host, "t", behaviour="raise")
    with pytest.raises(Exception, match="failed"):
        run_pass(host)
    html = _section(viewer_client.get(host_page(host)).content.decode(), "passes")
    assert 'class="da-failed"' in html
    assert "RuntimeError" in html


def test_host_page__the_audit_list_shows_operator_actions_on_submissions(
    viewer_client: Client, host: Host, clock: FakeClock
) -> None:
    import durable_agent
    from durable_agent.models import SubmissionState

    thread = ThreadFactory(host=host, key="orders")
    row = SubmissionFactory(
        thread=thread, sequence=1, state=SubmissionState.SUSPENDED, approval_reason="pay?"
    )
    durable_agent.approve(row, approved=False, actor="carol", reason="fraud suspected")

    html = viewer_client.get(host_page(host)).content.decode()

    audit = html[html.index('id="da-audit"') :]
    assert "reject" in audit
    assert "carol" in audit
    assert "fraud suspected" in audit
    assert "disarmed" not in audit  # a submission action does not move the slot
