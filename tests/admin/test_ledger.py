"""Threads and submissions in the admin: heads, filters, and the abort/approve actions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from durable_agent.models import (
    AlarmAudit,
    Host,
    Submission,
    SubmissionOutcome,
    SubmissionState,
    Thread,
)
from tests.admin.helpers import changelist, messages_of, post_action
from tests.factories import T0, SubmissionFactory, ThreadFactory

pytestmark = pytest.mark.django_db


def _submission(thread: Thread, sequence: int, state: str, **fields: Any) -> Submission:
    if state == SubmissionState.RUNNING:
        fields = {"lease_owner": "w", "lease_expires_at": T0 + timedelta(seconds=30), **fields}
    if state == SubmissionState.SUSPENDED:
        fields = {"approval_reason": "pay 10 EUR?", **fields}
    if state == SubmissionState.SETTLED:
        fields = {"outcome": SubmissionOutcome.COMPLETED, "settled_at": T0, **fields}
    return SubmissionFactory(thread=thread, sequence=sequence, state=state, **fields)


@pytest.fixture
def queue(host: Host) -> dict[str, Submission]:
    """Thread ``busy``: settled #1, suspended #2 (the head), ready #3; thread ``done``: settled."""
    busy = ThreadFactory(host=host, key="busy")
    done = ThreadFactory(host=host, key="done")
    return {
        "settled": _submission(busy, 1, SubmissionState.SETTLED),
        "head": _submission(busy, 2, SubmissionState.SUSPENDED),
        "behind": _submission(busy, 3, SubmissionState.READY),
        "done": _submission(done, 1, SubmissionState.SETTLED),
    }


def _results(client: Client, model: str, query: str = "") -> list[Any]:
    response = client.get(changelist(model) + query)
    assert response.status_code == 200
    return list(response.context["cl"].result_list)


def test_thread_changelist__head_and_counts(
    viewer_client: Client, queue: dict[str, Submission]
) -> None:
    rows = {t.key: t for t in _results(viewer_client, "thread")}
    busy, done = rows["busy"], rows["done"]
    assert (busy.head_id, busy.head_sequence, busy.head_state) == (queue["head"].pk, 2, "suspended")
    assert (busy.nonterminal, busy.total) == (2, 3)
    assert (done.head_id, done.nonterminal, done.total) == (None, 0, 1)
    html = viewer_client.get(changelist("thread")).content.decode()
    assert f"#2 (submission {queue['head'].pk})" in html


def test_thread_changelist__filters(viewer_client: Client, queue: dict[str, Submission]) -> None:
    assert [t.key for t in _results(viewer_client, "thread", "?active=yes")] == ["busy"]
    assert [t.key for t in _results(viewer_client, "thread", "?active=no")] == ["done"]
    assert [t.key for t in _results(viewer_client, "thread", "?head_state=suspended")] == ["busy"]
    assert _results(viewer_client, "thread", "?head_state=ready") == []
    host_id = queue["head"].host_id
    assert len(_results(viewer_client, "thread", f"?host__id__exact={host_id}")) == 2


def test_thread_page__shows_the_queue(viewer_client: Client, queue: dict[str, Submission]) -> None:
    thread = queue["head"].thread
    html = viewer_client.get(f"/admin/durable_agent/thread/{thread.pk}/change/").content.decode()
    assert "suspended" in html
    assert f"thread__id__exact={thread.pk}" in html
    assert html.count("<tr><td><a") == 2  # the two nonterminal submissions


def test_submission_changelist__head_column_and_filters(
    viewer_client: Client, queue: dict[str, Submission]
) -> None:
    heads = {s.pk for s in _results(viewer_client, "submission", "?head=yes")}
    assert heads == {queue["head"].pk}
    not_heads = {s.pk for s in _results(viewer_client, "submission", "?head=no")}
    assert not_heads == {queue["settled"].pk, queue["behind"].pk, queue["done"].pk}
    states = {s.pk for s in _results(viewer_client, "submission", "?state__exact=ready")}
    assert states == {queue["behind"].pk}
    assert len(_results(viewer_client, "submission", "?q=busy")) == 3


def test_ledger_changelists__constant_queries(
    viewer_client: Client, host: Host, queue: dict[str, Submission]
) -> None:
    def count(model: str) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert viewer_client.get(changelist(model)).status_code == 200
        return len(queries)

    before = (count("thread"), count("submission"))
    for n in range(10):
        thread = ThreadFactory(host=host, key=f"more-{n}")
        _submission(thread, 1, SubmissionState.READY)
    assert (count("thread"), count("submission")) == before


def test_approve__a_suspended_head_becomes_ready(
    operator_client: Client, queue: dict[str, Submission]
) -> None:
    head = queue["head"]
    response = post_action(
        operator_client,
        "submission",
        "approve_submissions",
        [head.pk],
        post="yes",
        reason="customer confirmed",
        follow=True,
    )
    head.refresh_from_db()
    assert head.state == SubmissionState.READY
    assert any("approve accepted; now ready" in m for m in messages_of(response))
    entry = LogEntry.objects.get(object_id=str(head.pk))
    assert (entry.user.username, entry.change_message) == (
        "operator",
        "approve: customer confirmed",
    )
    audit = AlarmAudit.objects.get(host_id=head.host_id)
    assert (audit.action, audit.actor, audit.reason) == (
        "approve",
        "operator",
        "customer confirmed",
    )


def test_reject__a_suspended_head_settles_failed(
    operator_client: Client, queue: dict[str, Submission]
) -> None:
    head = queue["head"]
    post_action(
        operator_client, "submission", "reject_submissions", [head.pk], post="yes", reason="no"
    )
    head.refresh_from_db()
    assert (head.state, head.outcome) == (SubmissionState.SETTLED, SubmissionOutcome.FAILED)
    audit = AlarmAudit.objects.get(host_id=head.host_id)
    assert (audit.action, audit.actor, audit.reason) == ("reject", "operator", "no")


def test_abort__refused_for_a_settled_submission(
    operator_client: Client, queue: dict[str, Submission]
) -> None:
    settled = queue["settled"]
    response = post_action(
        operator_client,
        "submission",
        "abort_submissions",
        [settled.pk],
        post="yes",
        reason="stop",
        follow=True,
    )
    assert any("Cannot abort" in m for m in messages_of(response))
    settled.refresh_from_db()
    assert settled.outcome == SubmissionOutcome.COMPLETED
    assert not LogEntry.objects.exists()


def test_abort__a_suspended_submission_settles_aborted(
    operator_client: Client, queue: dict[str, Submission]
) -> None:
    head = queue["head"]
    post_action(
        operator_client, "submission", "abort_submissions", [head.pk], post="yes", reason="stop"
    )
    head.refresh_from_db()
    assert (head.state, head.outcome) == (SubmissionState.SETTLED, SubmissionOutcome.ABORTED)
    audit = AlarmAudit.objects.get(host_id=head.host_id)
    assert (audit.action, audit.actor, audit.reason) == ("abort", "operator", "stop")


@pytest.mark.parametrize(
    "action", ["abort_submissions", "approve_submissions", "reject_submissions"]
)
def test_ledger_actions__need_the_repair_permission_and_a_reason(
    viewer_client: Client, operator_client: Client, queue: dict[str, Submission], action: str
) -> None:
    head = queue["head"]
    assert f'value="{action}"' not in viewer_client.get(changelist("submission")).content.decode()
    post_action(viewer_client, "submission", action, [head.pk], post="yes", reason="x")
    response = post_action(operator_client, "submission", action, [head.pk], post="yes", reason="")
    assert response.status_code == 200
    head.refresh_from_db()
    assert head.state == SubmissionState.SUSPENDED
    assert not LogEntry.objects.exists()


def test_ledger__read_only(operator_client: Client, queue: dict[str, Submission]) -> None:
    head = queue["head"]
    url = f"/admin/durable_agent/submission/{head.pk}/change/"
    assert operator_client.get(url).status_code == 200
    assert operator_client.post(url, {"state": "settled"}).status_code == 403
    assert operator_client.get("/admin/durable_agent/thread/add/").status_code == 403


def test_submission_page__a_retry_shows_its_attempts_next_try_and_last_error(
    operator_client: Client, host: Host
) -> None:
    thread = ThreadFactory(host=host, key="retrying")
    waiting = _submission(
        thread,
        1,
        SubmissionState.READY,
        attempts=2,
        not_before=T0 + timedelta(seconds=90),
        error={"type": "RateLimited", "message": "try again later"},
    )
    page = operator_client.get(f"/admin/durable_agent/submission/{waiting.pk}/change/")
    text = page.content.decode()
    assert page.status_code == 200
    assert "Not before" in text
    assert "try again later" in text
    assert "field-attempts" in text
