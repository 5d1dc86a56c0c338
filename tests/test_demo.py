"""The example project's demo: seeded submissions settle through alarm-driven passes."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

import durable_agent
from durable_agent.models import Submission
from durable_agent.testing import FakeClock
from tests.qdrive import drain_alarms

pytestmark = pytest.mark.django_db(transaction=True)


def test_seed_demo__submissions_settle_and_the_draft_waits_for_approval(clock: FakeClock) -> None:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert out.getvalue().strip() == "seeded 21 submissions on 3 hosts"
    call_command("seed_demo", stdout=StringIO())  # idempotent: replayed keys admit nothing
    assert Submission.objects.count() == 21
    drain_alarms(clock)
    states = dict(
        Submission.objects.filter(agent="summarise").values_list("state", "outcome").distinct()
    )
    assert states == {"settled": "completed"}
    assert set(Submission.objects.filter(agent="flaky-tool").values_list("outcome", flat=True)) <= {
        "completed",
        "failed",
    }
    drafts = Submission.objects.filter(agent="publish-draft")
    assert set(drafts.values_list("state", flat=True)) == {"suspended"}
    for draft in drafts:
        durable_agent.approve(draft.pk)
    drain_alarms(clock)
    assert set(drafts.values_list("outcome", flat=True)) == {"completed"}
    assert not Submission.objects.exclude(state="settled").exists()
