"""The admin's finish: names, one date format, highlighted failures, messages as written, and
a suspended submission's page that can approve or reject it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from durable_agent.models import Host, PassPhase, Submission, SubmissionState
from tests.admin.helpers import changelist, host_page, post_action
from tests.admin.test_ledger import _submission, queue  # noqa: F401 - a fixture
from tests.factories import T0, HostFactory, PassRecordFactory

pytestmark = pytest.mark.django_db

SUBMISSION = "/admin/durable_agent/submission/{}/change/"


def test_app_index__binding_retries_is_spelled_right(viewer_client: Client) -> None:
    html = viewer_client.get("/admin/durable_agent/").content.decode()
    assert "Binding retries" in html
    assert "retrys" not in html.lower()


def test_changelists__use_the_host_pages_date_format(viewer_client: Client, host: Host) -> None:
    PassRecordFactory(host=host, started_at=T0 + timedelta(seconds=5, milliseconds=250))
    html = viewer_client.get(changelist("passrecord")).content.decode()
    assert "2030-01-01 00:00:05.250 UTC" in html
    page = viewer_client.get(host_page(host)).content.decode()
    assert "2030-01-01 00:00:05.250 UTC" in page
    # Django's locale format (e.g. "Jan. 1, 2030, midnight") appears nowhere in the list.
    assert not re.search(r"Jan\. 1, 2030", html)


def test_pass_list__a_failed_pass_is_marked_for_highlighting_and_its_error_is_short(
    viewer_client: Client, host: Host
) -> None:
    PassRecordFactory(host=host, phase=PassPhase.CAUGHT_UP)
    long_error = "LaneNotRegistered: No handler registered for scheduled lane: " + "x" * 300
    PassRecordFactory(
        host=host,
        phase=PassPhase.FAILED,
        started_at=T0 + timedelta(seconds=1),
        error=long_error,
    )
    html = viewer_client.get(changelist("passrecord")).content.decode()
    assert html.count('class="da-phase da-phase-failed"') == 1
    assert html.count('class="da-phase da-phase-caught-up"') == 1
    shown = re.search(r'<span class="da-error" title="([^"]*)">([^<]*)</span>', html)
    assert shown is not None
    assert shown.group(1) == long_error  # the whole error is the tooltip
    assert len(shown.group(2)) <= 90
    stylesheet = finders.find("durable_agent/admin.css")
    assert stylesheet is not None
    with open(stylesheet, encoding="utf-8") as css:  # the rule that highlights the whole row
        assert "#result_list tr:has(.da-phase-failed) td" in css.read()


def test_messages__keep_the_host_key_as_written(operator_client: Client) -> None:
    host = HostFactory(key="billing-eu")
    response = post_action(
        operator_client,
        "host",
        "rearm_now",
        [host.pk],
        post="yes",
        reason="check",
        next=host_page(host),
        follow=True,
    )
    html = response.content.decode()
    assert "billing-eu: slot recomputed" in html
    assert "Billing-eu" not in html


def test_submission_page__title_uses_the_thread_key(
    viewer_client: Client,
    queue: dict[str, Submission],  # noqa: F811
) -> None:
    head = queue["head"]
    response = viewer_client.get(SUBMISSION.format(head.pk))
    assert response.context["title"] == f"Submission {head.pk}: thread busy #2 (suspended)"
    assert f"<h1>Submission {head.pk}: thread busy #2 (suspended)</h1>" in response.content.decode()


def test_submission_list__head_column_has_no_cross_on_settled_work(
    viewer_client: Client,
    queue: dict[str, Submission],  # noqa: F811
) -> None:
    html = viewer_client.get(changelist("submission")).content.decode()
    cells = dict(
        re.findall(
            r'<th class="field-id"><a href="[^"]*/submission/(\d+)/change/[^"]*">\d+</a></th>'
            r'.*?<td class="field-is_head">(.*?)</td>',
            html,
            re.S,
        )
    )
    assert "icon-yes" in cells[str(queue["head"].pk)]
    assert "icon-no" in cells[str(queue["behind"].pk)]
    assert cells[str(queue["settled"].pk)] == "-"
    assert cells[str(queue["done"].pk)] == "-"


def test_suspended_submission_page__approve_and_reject_buttons(
    operator_client: Client,
    viewer_client: Client,
    queue: dict[str, Submission],  # noqa: F811
) -> None:
    head = queue["head"]
    html = operator_client.get(SUBMISSION.format(head.pk)).content.decode()
    assert 'id="da-approval"' in html
    assert "pay 10 EUR?" in html
    assert 'data-action="approve_submissions"' in html
    assert 'data-action="reject_submissions"' in html
    # A viewer sees why it waits, not the buttons; a ready submission has no approval box.
    viewer_html = viewer_client.get(SUBMISSION.format(head.pk)).content.decode()
    assert 'id="da-approval"' in viewer_html
    assert 'data-action="approve_submissions"' not in viewer_html
    behind = operator_client.get(SUBMISSION.format(queue["behind"].pk)).content.decode()
    assert 'id="da-approval"' not in behind
    # The button posts the changelist action; confirming approves and comes back here.
    confirm = post_action(
        operator_client, "submission", "approve_submissions", [head.pk], next=SUBMISSION
    )
    assert confirm.status_code == 200
    assert "Approve submissions" in confirm.content.decode()
    done = post_action(
        operator_client,
        "submission",
        "approve_submissions",
        [head.pk],
        post="yes",
        reason="customer confirmed",
        next=SUBMISSION.format(head.pk),
        follow=True,
    )
    head.refresh_from_db()
    assert head.state == SubmissionState.READY
    assert done.redirect_chain[-1][0] == SUBMISSION.format(head.pk)
    assert 'id="da-approval"' not in done.content.decode()
