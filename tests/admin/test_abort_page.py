"""The admin's Abort page says what ``durable_agent.abort`` does, and docs/admin.md says what
the ledger actions audit."""

from __future__ import annotations

import html
from pathlib import Path

import pytest
from django.test import Client

from durable_agent.models import AlarmAudit, Host, SubmissionOutcome, SubmissionState
from tests.admin.helpers import post_action
from tests.factories import SubmissionFactory, ThreadFactory

pytestmark = pytest.mark.django_db

ADMIN_DOC = Path(__file__).resolve().parents[2] / "docs" / "admin.md"


def test_abort_page__an_unknown_submission_is_aborted_as_the_page_says(
    operator_client: Client, host: Host
) -> None:
    row = SubmissionFactory(
        thread=ThreadFactory(host=host, key="t"), sequence=1, state=SubmissionState.UNKNOWN
    )
    page = post_action(operator_client, "submission", "abort_submissions", [row.pk])
    text = html.unescape(" ".join(page.content.decode().split()))
    assert "A ready, suspended or unknown submission settles 'aborted' at once" in text
    assert "unknown submissions are refused" not in text
    assert "Settled submissions are refused." in text

    post_action(
        operator_client, "submission", "abort_submissions", [row.pk], post="yes", reason="gone"
    )
    row.refresh_from_db()
    assert (row.state, row.outcome) == (SubmissionState.SETTLED, SubmissionOutcome.ABORTED)
    audit = AlarmAudit.objects.get(host=host)
    assert (audit.action, audit.actor, audit.reason) == ("abort", "operator", "gone")


def test_admin_doc__the_ledger_actions_write_an_audit_row() -> None:
    doc = ADMIN_DOC.read_text(encoding="utf-8")
    [row] = [line for line in doc.splitlines() if line.startswith("| Abort / approve / reject")]
    assert row.rstrip(" |").endswith("`abort`, `approve`, `reject`")
    assert "write no `AlarmAudit` row" not in doc
