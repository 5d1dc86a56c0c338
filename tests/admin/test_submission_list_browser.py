"""The submission list in a real browser at 1400 px: every column visible, the sort arrow on
the column the list is ordered by."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User

from durable_agent.models import SubmissionState
from durable_agent.testing import FakeClock
from tests.admin import browser
from tests.factories import HostFactory, SubmissionFactory, ThreadFactory

pytestmark = pytest.mark.django_db(transaction=True)
LIST = "/admin/durable_agent/submission/"


@pytest.fixture
def page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    browser.require_browser()
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with browser.chromium_page() as chromium:
        yield chromium


def _overflow(page: Any) -> int:
    """Pixels of the page cut off on the right: the table's or the document's (0: none)."""
    return int(
        page.evaluate(
            """() => {
                const table = document.querySelector('#result_list');
                const right = table.getBoundingClientRect().right;
                const page = document.documentElement.scrollWidth;
                return Math.max(0, Math.ceil(right - window.innerWidth),
                                page - document.documentElement.clientWidth);
            }"""
        )
    )


def test_browser__submission_list_fits_1400_px_and_its_arrow_is_its_order(
    live_server: Any, page: Any, clock: FakeClock, tmp_path: Path
) -> None:
    user = User.objects.create_user("operator", password="operator-pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="durable_agent"))
    host = HostFactory(key="payments-eu-west-production")
    for n in range(1, 13):
        thread = ThreadFactory(host=host, key=f"customer-conversation-{n:04d}")
        state = [SubmissionState.READY, SubmissionState.SUSPENDED, SubmissionState.RUNNING][n % 3]
        SubmissionFactory(
            thread=thread,
            sequence=1,
            agent="summarise-conversation",
            agent_version="2026-11-30",
            state=SubmissionState.SETTLED,
            outcome="completed",
            settled_at=clock.now(),
            attempts=2,
            updated_at=clock.now() - timedelta(minutes=n),
        )
        SubmissionFactory(
            thread=thread,
            sequence=2,
            agent="refund-customer",
            agent_version="3",
            state=state,
            approval_reason="refund?" if state == SubmissionState.SUSPENDED else None,
            lease_owner="worker-1" if state == SubmissionState.RUNNING else None,
            lease_expires_at=clock.now() if state == SubmissionState.RUNNING else None,
            abort_requested_at=clock.now() if n % 4 == 0 else None,
            attempts=n,
            updated_at=clock.now() - timedelta(minutes=n, seconds=30),
        )
    page.set_viewport_size({"width": 1400, "height": 900})
    browser.log_in(page, live_server.url, "operator", "operator-pw", LIST)
    browser.screenshot(page, "admin-submission-list.png", tmp_path)
    assert _overflow(page) == 0, "the submission list is wider than a 1400 px window"
    for column in ("attempts_shown", "abort_requested", "updated_at"):
        header = page.locator(f"#result_list th.column-{column}")
        assert header.is_visible()
        box = header.bounding_box()
        assert box["x"] + box["width"] <= 1400, column
    # The list is ordered by updated at, newest first, and that column shows the arrow.
    arrow = page.locator("#result_list th.sorted")
    assert arrow.count() == 1
    assert "column-updated_at" in arrow.get_attribute("class")
    assert "descending" in arrow.get_attribute("class")
    shown = page.locator("#result_list td.field-updated_at").all_inner_texts()
    assert shown == sorted(shown, reverse=True)
