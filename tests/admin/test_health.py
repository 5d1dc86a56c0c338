"""The shared read model: failing hosts on every surface, admin/API agreement, audit queries."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django_q.models import Schedule
from ninja.testing import TestClient

from durable_agent import lanes
from durable_agent.api import router
from durable_agent.api.tokens import issue_token
from durable_agent.checks import check_alarm_invariant
from durable_agent.errors import LaneNotRegistered
from durable_agent.maintenance import alarm, gate, run_pass
from durable_agent.maintenance.operators.audit import PAGE_SIZE, audit_all, audit_host
from durable_agent.models import DueLane, Host, MaintenanceState, PassRecord, SubmissionState
from durable_agent.runtime import get_runtime
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.admin.helpers import changelist, fail_recovery, host_page, park, wait_for_binding
from tests.factories import HostFactory, PassRecordFactory, SubmissionFactory
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/durable_agent/host/dashboard/"


def _api() -> tuple[TestClient, dict[str, str]]:
    secret = issue_token(name="reader", scope="read").secret
    return TestClient(router), {"Authorization": f"Bearer {secret}"}


def _audit_command() -> tuple[str, int]:
    out = StringIO()
    try:
        call_command("maintenance_audit", stdout=out)
    except CommandError as exc:
        return out.getvalue(), exc.returncode
    return out.getvalue(), 0


def _dashboard_count(html: str, name: str) -> int:
    marker = f'data-count="{name}">'
    start = html.index(marker) + len(marker)
    return int(html[start : html.index("<", start)])


def _orphan_lane_pass(host: Host, clock: FakeClock) -> None:
    """One pass of a host whose scheduled lane has no handler: it fails."""
    clock.advance(seconds=5)
    with pytest.raises(LaneNotRegistered):
        run_pass(host)


def test_failing_host__every_surface_says_so_and_heals_when_the_handler_is_registered(
    viewer_client: Client, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host = HostFactory(key="billing-eu")
    HostFactory(key="quiet")
    caught_up(host)
    gate.schedule(host, "orphan", clock.now())  # scheduled, but nothing registers "orphan"
    api, auth = _api()
    for _ in range(2):  # FAILING_AFTER_PASSES is 3: two failures are not yet failing
        _orphan_lane_pass(host, clock)
    health = api.get("/health", headers=auth).json()
    assert (health["ok"], health["failing"]) == (True, [])
    _orphan_lane_pass(host, clock)

    # GET health
    health = api.get("/health", headers=auth).json()
    assert health["ok"] is False
    assert health["violating"] == []  # the invariant holds: the slot is armed
    ((failing),) = health["failing"]
    assert failing["host"] == "billing-eu"
    assert failing["failed_passes"] == 3
    assert failing["error"].startswith("LaneNotRegistered: No handler registered")
    # GET hosts and GET hosts/{key}
    items = {i["key"]: i for i in api.get("/hosts", headers=auth).json()["items"]}
    assert (items["billing-eu"]["failing"], items["quiet"]["failing"]) == (True, False)
    assert [i["key"] for i in api.get("/hosts?failing=true", headers=auth).json()["items"]] == [
        "billing-eu"
    ]
    detail = api.get("/hosts/billing-eu", headers=auth).json()
    assert (detail["failing"], detail["failed_passes"]) == (True, 3)
    # maintenance_audit
    out, code = _audit_command()
    assert code == 1
    assert "failing: 1" in out
    assert "FAILING billing-eu: 3 passes failed in a row; last error: LaneNotRegistered" in out
    # check --deploy
    (warning,) = check_alarm_invariant(databases=["default"])
    assert warning.id == "durable_agent.W011"
    assert "billing-eu" in warning.msg
    # the dashboard: a card and a list entry
    html = viewer_client.get(DASHBOARD).content.decode()
    assert _dashboard_count(html, "failing") == 1
    failing_list = html[html.index('id="da-failing-list"') : html.index('id="da-overdue-list"')]
    assert "billing-eu" in failing_list
    assert "LaneNotRegistered" in failing_list
    # the host list: a badge
    listing = viewer_client.get(changelist("host")).content.decode()
    row = re.search(r"<tr>(?:(?!</tr>).)*billing-eu(?:(?!</tr>).)*</tr>", listing, re.S)
    assert row is not None
    assert 'class="da-badge da-badge-bad"' in row.group(0)
    assert ">failing<" in row.group(0)
    filtered = viewer_client.get(changelist("host") + "?failing=yes")
    assert [h.key for h in filtered.context["cl"].result_list] == ["billing-eu"]
    # the host page: the error and what to do
    page = viewer_client.get(host_page(host)).content.decode()
    banner = page[page.index('id="da-failing"') : page.index('class="module da-summary"')]
    assert "the last 3 passes failed" in banner
    assert "LaneNotRegistered" in banner
    assert "register the handler" in banner

    lanes.register("orphan", lambda ctx: None)  # the deploy that registers the handler
    clock.advance(seconds=5)
    run_pass(host)
    assert api.get("/health", headers=auth).json()["ok"] is True
    assert api.get("/hosts/billing-eu", headers=auth).json()["failing"] is False
    assert _audit_command()[1] == 0
    assert check_alarm_invariant(databases=["default"]) == []
    html = viewer_client.get(DASHBOARD).content.decode()
    assert _dashboard_count(html, "failing") == 0
    listing = viewer_client.get(changelist("host")).content.decode()
    assert ">failing<" not in listing
    assert 'id="da-failing"' not in viewer_client.get(host_page(host)).content.decode()


def test_failure_streak__busy_passes_do_not_count_and_a_success_ends_it(
    settings: Any, clock: FakeClock
) -> None:
    settings.DURABLE_AGENT = {**settings.DURABLE_AGENT, "FAILING_AFTER_PASSES": 2}
    host = HostFactory(key="streaky")
    at = clock.now()

    def record(phase: str, minutes: int) -> None:
        PassRecordFactory(host=host, phase=phase, started_at=at + timedelta(minutes=minutes))

    record("failed", 1)
    record("caught-up", 2)
    record("failed", 3)
    record("busy", 4)
    (summary,) = audit_all().failing or (None,)
    assert summary is None  # one failure since the success; the busy pass does not count
    record("failed", 5)
    (failing,) = audit_all().failing
    assert failing.failed_passes == 2
    record("actionable", 6)
    assert audit_all().failing == ()


def test_owed_work__suspended_unknown_and_binding_waits_are_counted(
    viewer_client: Client, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    host = HostFactory(key="owing")
    for _ in range(3):
        SubmissionFactory(
            thread__host=host, state=SubmissionState.SUSPENDED, approval_reason="refund"
        )
    SubmissionFactory(thread__host=host, state=SubmissionState.UNKNOWN)
    SubmissionFactory(
        thread__host=host, state="settled", outcome="completed", settled_at=clock.now()
    )
    waiting = HostFactory(key="waiting")
    wait_for_binding(waiting, runtime)
    html = viewer_client.get(DASHBOARD).content.decode()
    assert _dashboard_count(html, "suspended") == 3
    assert _dashboard_count(html, "unknown") == 1
    assert _dashboard_count(html, "binding") == 1
    assert "nothing is owed" not in html
    page = viewer_client.get(host_page(host))
    facts = {f.label: f for f in page.context["page"].facts}
    owed = facts["Owed work"]
    assert "3 suspended (waiting for approval)" in owed.value
    assert "1 unknown (to resolve)" in owed.value
    assert owed.tone == "warn"
    page = viewer_client.get(host_page(waiting))
    facts = {f.label: f for f in page.context["page"].facts}
    assert "1 waiting for a binding" in facts["Owed work"].value


def _mixed_fleet(clock: FakeClock, runtime: ScriptedRuntime) -> None:
    """Hosts in every state the read model names, some in two at once."""
    caught_up(HostFactory(key="a-ok"))
    late = HostFactory(key="b-overdue")
    caught_up(late)
    gate.schedule(late, "outbox", clock.now())
    park(HostFactory(key="c-parked"), clock)
    fail_recovery(HostFactory(key="d-faulted"), runtime)
    wait_for_binding(HostFactory(key="e-binding"), runtime)
    stale = HostFactory(key="f-stale-binding")
    wait_for_binding(stale, runtime)
    stale.binding_retries.update(registry_key="a-registry-since-replaced")
    failing = HostFactory(key="g-failing")
    caught_up(failing)
    gate.schedule(failing, "orphan", clock.now())
    for _ in range(3):
        _orphan_lane_pass(failing, clock)
    disarmed = HostFactory(key="h-disarmed-but-owing")
    runtime.submit(disarmed, "t1")
    disarmed.refresh_from_db()
    Schedule.objects.filter(pk=disarmed.alarm_id).update(repeats=0)  # behind the app's back
    HostFactory(key="i-new")  # no state row, no alarm
    clock.advance(minutes=3)  # b-overdue (and every armed slot left behind) is overdue now


def test_admin_and_api_agree_on_every_host_of_a_mixed_fleet(
    viewer_client: Client, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    _mixed_fleet(clock, runtime)
    assert get_runtime().binding_registry_key() != "a-registry-since-replaced"
    api, auth = _api()
    hosts = {i["key"]: i for i in api.get("/hosts?limit=100", headers=auth).json()["items"]}
    listing = viewer_client.get(changelist("host"))
    rows = {h.key: h for h in listing.context["cl"].result_list}
    assert set(hosts) == set(rows) == set(Host.objects.values_list("key", flat=True))
    verdicts = {}
    for key, item in sorted(hosts.items()):
        detail = api.get(f"/hosts/{key}", headers=auth).json()
        page = viewer_client.get(host_page(rows[key])).context["page"]
        row = rows[key]
        admin_view = {
            "armed": row.slot_at is not None,
            "overdue": page.audit.overdue,
            "failing": page.audit.failing,
            "failed_passes": page.audit.failed_passes,
            "parked": row.parked_lanes,
            "faults": row.open_faults,
            "binding": row.binding_waits,
            "dirty": row.gen_dirty > row.gen_processed,
            "invariant": (page.audit.ok, list(page.audit.violations)),
        }
        api_view = {
            "armed": item["alarm"] is not None,
            "overdue": item["overdue"],
            "failing": item["failing"],
            "failed_passes": item["failed_passes"],
            "parked": item["parked_lanes"],
            "faults": item["faults"],
            "binding": item["binding_retries"],
            "dirty": item["dirty"] > item["processed"],
            "invariant": (detail["invariant"]["ok"], detail["invariant"]["violations"]),
        }
        assert admin_view == api_view, key
        assert (detail["overdue"], detail["failing"]) == (item["overdue"], item["failing"]), key
        verdicts[key] = api_view
    # The fleet covers every state, so the agreement above is not vacuous.
    assert verdicts["b-overdue"]["overdue"] is True
    assert verdicts["c-parked"]["parked"] == 1
    assert verdicts["d-faulted"]["faults"] == 1
    assert verdicts["e-binding"]["binding"] == 1
    assert verdicts["f-stale-binding"]["invariant"][0] is False  # registry_key is checked
    assert verdicts["g-failing"]["failing"] is True
    assert verdicts["h-disarmed-but-owing"]["invariant"] == (
        False,
        ["owed work without an armed alarm"],
    )
    assert verdicts["i-new"]["armed"] is False
    # health names the same hosts
    health = api.get("/health", headers=auth).json()
    assert {h["host"] for h in health["violating"]} == {
        k for k, v in verdicts.items() if not v["invariant"][0]
    }
    assert {h["host"] for h in health["failing"]} == {
        k for k, v in verdicts.items() if v["failing"]
    }
    assert set(health["overdue"]) == {k for k, v in verdicts.items() if v["overdue"]}


@pytest.mark.parametrize("hosts", [10, 1000])
def test_audit_all__a_constant_number_of_queries_per_page(
    hosts: int, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    made = Host.objects.bulk_create([Host(key=f"h{n:04d}") for n in range(hosts)])
    MaintenanceState.objects.bulk_create(
        [MaintenanceState(host=h, dirty=1, processed=1) for h in made]
    )
    # A third fail, a third succeed (healthy: counted, not read), a third never ran a pass
    # but have a parked lane (read, with no failed pass: no query of their own).
    PassRecord.objects.bulk_create(
        [
            PassRecord(host=h, started_at=clock.now(), phase="failed", error="E")
            for h in made[0::3]
            for _ in range(3)  # FAILING_AFTER_PASSES
        ]
        + [PassRecord(host=h, started_at=clock.now(), phase="caught-up") for h in made[1::3]]
    )
    DueLane.objects.bulk_create([DueLane(host=h, lane="stuck", state="parked") for h in made[2::3]])
    with CaptureQueriesContext(connection) as queries:
        summary = audit_all(registry_key=get_runtime().binding_registry_key())
    assert summary.hosts == hosts
    assert len(summary.failing) == len(made[0::3])
    assert len(summary.parked) == len(made[2::3])
    # One count, one read of the hosts that may be unhealthy, then three per page of them
    # (Note [The audit reads its candidates first]), then two for the work that waits for a
    # person (durable_agent/maintenance/operators/attention.py).
    read = len(made[0::3]) + len(made[2::3])
    expected = 4 + 3 * -(-read // PAGE_SIZE)
    assert len(queries) == expected, "\n".join(q["sql"] for q in queries.captured_queries)
    assert expected == (7 if hosts == 10 else 10)


def test_health_setting__validated_by_the_system_checks(settings: Any) -> None:
    from durable_agent.checks import check_settings

    settings.DURABLE_AGENT = {"FAILING_AFTER_PASSES": 0}
    assert [e.id for e in check_settings()] == ["durable_agent.E004"]
    settings.DURABLE_AGENT = {"FAILING_AFTER_PASSES": "3"}
    assert [e.id for e in check_settings()] == ["durable_agent.E003"]


def test_health_json_lists_failing_hosts(clock: FakeClock, runtime: ScriptedRuntime) -> None:
    host = HostFactory(key="jsonish")
    caught_up(host)
    gate.schedule(host, "orphan", clock.now())
    for _ in range(3):
        _orphan_lane_pass(host, clock)
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("maintenance_audit", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["ok"] is False
    assert [f["host"] for f in data["failing"]] == ["jsonish"]
    assert alarm.scheduled(host) is not None


def test_audit_all__reads_only_hosts_that_may_be_unhealthy_and_misses_none(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    _mixed_fleet(clock, runtime)
    late = HostFactory(key="j-slot-later-than-work")
    lanes.register("outbox", lambda ctx: None)
    caught_up(late)
    gate.schedule(late, "outbox", clock.now() + timedelta(seconds=10))
    Schedule.objects.filter(pk=Host.objects.get(pk=late.pk).alarm_id).update(
        next_run=clock.now() + timedelta(hours=1)
    )
    waiting = HostFactory(key="k-future-work")  # owes work later, armed for it: healthy
    caught_up(waiting)
    gate.schedule(waiting, "outbox", clock.now() + timedelta(hours=2))
    key = get_runtime().binding_registry_key()
    now = clock.now()
    summary = audit_all(now=now, registry_key=key)
    every = [
        audit_host(h, now=now, registry_key=key)
        for h in Host.objects.select_related("alarm").order_by("pk")
    ]
    assert summary.hosts == len(every) == 11
    assert [h.host for h in summary.violating] == [h.host for h in every if not h.ok]
    assert "j-slot-later-than-work" in [h.host for h in summary.violating]
    assert [h.host for h in summary.failing] == [h.host for h in every if h.failing]
    assert list(summary.overdue) == [h.host for h in every if h.overdue]
    assert summary.parked == {h.host: h.parked_lanes for h in every if h.parked_lanes}
    assert list(summary.stale_leases) == [h.host for h in every if h.stale_lease]
    assert summary.violating == tuple(h for h in every if not h.ok)
