"""The admin in a real browser: headless Chromium driven by Playwright against live_server.

The live server runs in a thread of this process, so the fake clock and the scripted runtime
the test installs are the ones its requests see. Run just these with
``.venv/bin/pytest tests/admin/test_browser.py``; set DURABLE_AGENT_SCREENSHOTS=docs/images to
refresh the documentation's screenshots.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User

from durable_agent import lanes
from durable_agent.errors import LaneNotRegistered
from durable_agent.maintenance import alarm, gate, run_pass
from durable_agent.models import AlarmAudit, DueLane, Host
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.admin import browser
from tests.admin.helpers import fail_recovery, park, wait_for_binding
from tests.factories import HostFactory, PassRecordFactory, SubmissionFactory
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db(transaction=True)

DASHBOARD = "/admin/durable_agent/host/dashboard/"


@pytest.fixture
def page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    browser.require_browser()
    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # between browser steps are still synchronous and safe.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with browser.chromium_page() as chromium:
        yield chromium


@pytest.fixture
def operator_login(db: None) -> tuple[str, str]:
    user = User.objects.create_user("operator", password="operator-pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="durable_agent"))
    return "operator", "operator-pw"


def _fact(page: Any, slug: str) -> str:
    return str(page.inner_text(f'[data-fact="{slug}"]'))


def test_browser__dashboard_unpark_and_rearm_at(
    live_server: Any,
    page: Any,
    operator_login: tuple[str, str],
    clock: FakeClock,
    runtime: ScriptedRuntime,
    tmp_path: Path,
) -> None:
    host = HostFactory(key="billing-eu")
    park(host, clock)
    base = live_server.url

    browser.log_in(page, base, *operator_login, DASHBOARD)
    assert page.inner_text('[data-count="parked"]') == "1"
    assert page.locator("#da-timeline svg .da-mark").count() == 1
    page.click("#da-parked-list a:text('billing-eu')")

    lane = page.locator('tr[data-lane="outbox"]')
    assert lane.locator(".da-state").inner_text() == "parked"
    lane.locator("button:text('Unpark…')").click()
    assert page.locator("h1").inner_text() == "Unpark lanes"
    assert "billing-eu: lane outbox (parked)" in page.inner_text(".da-targets")
    page.click("input[type=submit][value='Unpark']")  # no reason yet
    assert "This field is required." in page.inner_text("#da-confirm-form")
    assert DueLane.objects.get(host=host, lane="outbox").state == "parked"
    page.fill("#id_reason", "sink fixed")
    page.click("input[type=submit][value='Unpark']")

    page.wait_for_selector("ul.messagelist li.success")
    assert "lane outbox unparked" in page.inner_text("ul.messagelist")
    assert lane.locator(".da-state").inner_text() == "pending"
    audit = page.locator("#da-audit tbody tr").first
    assert audit.locator("td").all_inner_texts()[1:4] == ["unpark", "operator", "sink fixed"]

    at = (clock.now() - timedelta(minutes=1)).replace(microsecond=0)
    page.click("#da-host-actions button:text('Rearm at…')")
    page.fill("#id_at", at.strftime("%Y-%m-%dT%H:%M:%S"))
    page.fill("#id_reason", "fire the backlog now")
    page.click("input[type=submit][value='Rearm']")

    page.wait_for_selector("ul.messagelist li.success")
    slot_text = at.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert _fact(page, "alarm-slot") == slot_text
    assert "slot set to " + slot_text in page.inner_text("ul.messagelist")
    rows = page.locator("#da-audit tbody tr")
    assert rows.count() == 2
    assert rows.first.locator("td").all_inner_texts()[1:6] == [
        "rearm",
        "operator",
        "fire the backlog now",
        rows.first.locator("td").all_inner_texts()[4],
        slot_text,
    ]
    assert alarm.scheduled(host) == at
    assert list(AlarmAudit.objects.values_list("action", "actor").order_by("pk")) == [
        ("unpark", "operator"),
        ("rearm", "operator"),
    ]
    browser.screenshot(page, "admin-host-after-repair.png", tmp_path)


def _busy_fleet(clock: FakeClock, runtime: ScriptedRuntime) -> Host:
    """A handful of hosts in every state the dashboard and the host page show."""
    for lane in ("reindex", "invoices"):
        lanes.register(lane, lambda ctx: None)
    late = HostFactory(key="search-indexer")
    caught_up(late)
    gate.schedule(late, "reindex", clock.now())
    clock.advance(minutes=3)
    star = HostFactory(key="billing-eu")
    park(star, clock)
    gate.schedule(star, "invoices", clock.now() + timedelta(minutes=4))
    wait_for_binding(star, runtime, thread="support-42")
    fail_recovery(star, runtime, thread="refunds-7")
    for n, minutes in enumerate((0.5, 2, 5, 9, 14, 22, 35, 48)):
        host = HostFactory(key=f"tenant-{n + 1:02d}", single_thread=n % 3 == 0)
        caught_up(host)
        gate.schedule(host, "outbox", clock.now() + timedelta(minutes=minutes))
    alarm.rearm(star, actor="alice", reason="re-checked after the billing deploy")
    lateness = [-20, 12, 30, 45, 60, 80, 95, 120, 160, 240, 380, 420, 700, 900, 1500, 2600]
    lateness += [40] * 14 + [70] * 9 + [6_500, 12_000, 75_000]
    for index, value in enumerate(lateness):
        PassRecordFactory(
            host=star if index % 4 == 0 else late,
            started_at=clock.now() - timedelta(minutes=index),
            lateness_ms=value,
            phase="actionable" if index % 3 == 0 else "caught-up",
            alarm="rearmed",
        )
    return star


def test_browser__screenshots_of_the_dashboard_and_a_host(
    live_server: Any,
    page: Any,
    operator_login: tuple[str, str],
    clock: FakeClock,
    runtime: ScriptedRuntime,
    tmp_path: Path,
) -> None:
    star = _busy_fleet(clock, runtime)
    base = live_server.url

    browser.log_in(page, base, *operator_login, DASHBOARD)
    assert page.locator("#da-timeline svg .da-mark").count() == 10
    assert page.locator("#da-lateness svg .da-bar").count() == 12
    dashboard = browser.screenshot(page, "admin-dashboard.png", tmp_path)

    page.goto(f"{base}/admin/durable_agent/host/{star.pk}/change/")
    assert page.locator("tr.da-sets-alarm").count() == 1
    host = browser.screenshot(page, "admin-host.png", tmp_path)

    page.set_viewport_size({"width": 1760, "height": 900})
    page.goto(f"{base}/admin/durable_agent/host/")
    changelist = browser.screenshot(page, "admin-hosts.png", tmp_path)
    page.set_viewport_size({"width": 1280, "height": 900})

    page.goto(f"{base}/admin/durable_agent/host/{star.pk}/change/")
    page.click('tr[data-lane="outbox"] button:text("Unpark…")')
    confirm = browser.screenshot(page, "admin-confirm-unpark.png", tmp_path)

    for path in (dashboard, host, changelist, confirm):
        assert path.stat().st_size > 10_000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_browser__landing_page_links_the_admin_dashboard_api_docs_and_health(
    live_server: Any, page: Any, operator_login: tuple[str, str]
) -> None:
    """``/`` answers 200 and every link on it works, the Swagger UI from local static files."""
    base = live_server.url
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    response = page.goto(f"{base}/")
    assert response.status == 200
    assert page.locator("h1").inner_text() == "durable_agent example project"
    browser.log_in(page, base, *operator_login, "/")
    links = {
        link.get_attribute("data-link"): link.get_attribute("href")
        for link in page.locator("#landing a[data-link]").all()
    }
    assert links == {
        "admin": "/admin/",
        "dashboard": DASHBOARD,
        "api-docs": "/api/durable-agent/docs",
        "health": "/api/durable-agent/health",
    }

    page.click("a[data-link=admin]")
    assert page.locator("#site-name").inner_text().startswith("durable_agent")
    assert page.title().endswith("| durable_agent example")
    page.click("#user-tools a:text('Home')")
    page.click("a[data-link=dashboard]")
    assert page.url == f"{base}{DASHBOARD}"
    assert page.locator('[data-count="parked"]').count() == 1

    page.goto(f"{base}/")
    page.click("a[data-link=api-docs]")
    page.wait_for_selector(".swagger-ui .info .title")  # rendered by the local bundle
    assert "durable_agent" in page.locator(".swagger-ui .info .title").inner_text()
    assert not [url for url in requested if not url.startswith(base)]  # no CDN, nothing remote

    health = page.goto(f"{base}/api/durable-agent/health")
    assert health.status == 200
    assert "application/json" in health.headers["content-type"]


def _overflow(page: Any) -> int:
    """How many pixels of the changelist's table are cut off on the right (0: all visible)."""
    return int(
        page.evaluate(
            """() => {
                const table = document.querySelector('#result_list');
                const right = table.getBoundingClientRect().right;
                const box = document.querySelector('#changelist .results') || table;
                const edge = Math.min(box.getBoundingClientRect().right, window.innerWidth);
                return Math.max(0, Math.ceil(right - edge));
            }"""
        )
    )


def test_browser__failing_host_and_lists_at_1400_px(
    live_server: Any,
    page: Any,
    operator_login: tuple[str, str],
    clock: FakeClock,
    runtime: ScriptedRuntime,
    tmp_path: Path,
) -> None:
    _busy_fleet(clock, runtime)
    failing = HostFactory(key="payments-us")
    caught_up(failing)
    gate.schedule(failing, "orphan", clock.now())  # no handler: every pass fails
    for _ in range(3):
        clock.advance(seconds=5)
        with pytest.raises(LaneNotRegistered):
            run_pass(failing)
    base = live_server.url
    page.set_viewport_size({"width": 1400, "height": 900})
    browser.log_in(page, base, *operator_login, DASHBOARD)
    assert page.inner_text('[data-count="failing"]') == "1"
    page.click("#da-failing-list a:text('payments-us')")
    assert "the last 3 passes failed" in page.inner_text("#da-failing h2")
    assert "register the handler" in page.inner_text("#da-failing")
    assert _fact(page, "health") == "FAILING"
    assert page.locator("#da-passes tr.da-failed").count() == 3
    browser.screenshot(page, "admin-host-failing.png", tmp_path)

    page.goto(f"{base}/admin/durable_agent/host/")
    assert _overflow(page) == 0, "the host list cuts off its right-hand columns at 1400 px"
    assert page.locator("th.column-last_pass").is_visible()
    badge = page.locator("tr:has(a:text('payments-us')) .da-badge")
    assert badge.inner_text() == "failing"

    page.goto(f"{base}/admin/durable_agent/passrecord/")
    assert _overflow(page) == 0, "the pass list cuts off the Error column at 1400 px"
    failed_row = page.locator("#result_list tr:has(.da-phase-failed)").first
    background = failed_row.locator("td").first.evaluate(
        "cell => getComputedStyle(cell).backgroundColor"
    )
    plain = page.locator("#result_list tr:has(.da-phase-actionable) td").first.evaluate(
        "cell => getComputedStyle(cell).backgroundColor"
    )
    assert background != plain
    assert page.locator("td.field-error_shown .da-error").first.is_visible()
    assert page.locator("#result_list .field-started_at").first.inner_text().endswith(" UTC")

    # A suspended submission's page approves it, and the message keeps the thread key.
    waiting = SubmissionFactory(
        thread__host=failing,
        thread__key="refund-9",
        state="suspended",
        approval_reason="refund 120 EUR?",
    )
    page.goto(f"{base}/admin/durable_agent/submission/{waiting.pk}/change/")
    assert page.locator("h1").inner_text() == (
        f"Submission {waiting.pk}: thread refund-9 #{waiting.sequence} (suspended)"
    )
    assert "refund 120 EUR?" in page.inner_text("#da-approval")
    page.click("#da-approval button:text('Approve…')")
    page.fill("#id_reason", "customer confirmed")
    page.click("input[type=submit][value='Approve']")
    page.wait_for_selector("ul.messagelist li.success")
    assert page.inner_text("ul.messagelist li.success").startswith(f"Submission {waiting.pk}")
    assert page.locator("#da-approval").count() == 0
    waiting.refresh_from_db()
    assert waiting.state == "ready"


def test_browser__host_list_prefix_search_key_sort_pages_and_count(
    live_server: Any,
    page: Any,
    operator_login: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import connection

    from durable_agent.admin import paging
    from durable_agent.admin.hosts import HostAdmin

    for key in ("billing-eu", "eu-billing", "tenant-1", "tenant-2", "tenant-3", "tenant-4"):
        HostFactory(key=key)
    monkeypatch.setattr(HostAdmin, "list_per_page", 4)
    if connection.vendor == "postgresql":  # Note [Estimated host counts]
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE durable_agent_host")
        monkeypatch.setattr(paging, "EXACT_BELOW", 1)
    base = live_server.url
    hosts = "/admin/durable_agent/host/"
    browser.log_in(page, base, *operator_login, hosts)

    def keys() -> list[str]:
        return list(page.locator("#result_list tbody th a").all_inner_texts())

    counted = page.inner_text("p.paginator")
    if connection.vendor == "postgresql":
        assert "about 6 hosts" in counted
    else:
        assert "6 hosts" in counted
        assert "about" not in counted
    assert keys() == ["billing-eu", "eu-billing", "tenant-1", "tenant-2"]
    # Only the key sorts: one sortable header, and it sorts.
    assert page.locator("#result_list thead th.sortable").count() == 1
    page.click("#result_list thead th.column-key_and_kind .text a")  # sorted by key: reverse
    page.wait_for_url("**o=-1**")
    assert keys() == ["tenant-4", "tenant-3", "tenant-2", "tenant-1"]
    # A page link reads the next page (Note [A page is read by its ids]).
    page.goto(f"{base}{hosts}")
    page.click("p.paginator a:text('2')")
    page.wait_for_url("**p=2**")
    assert keys() == ["tenant-3", "tenant-4"]
    # The search is a key prefix: "billing" finds billing-eu, not eu-billing.
    page.fill("#searchbar", "billing")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=billing**")
    assert keys() == ["billing-eu"]
    assert "1 host" in page.inner_text("p.paginator")
    assert "Search by the start of a host key." in page.inner_text("#changelist-search")
