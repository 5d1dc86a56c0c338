"""The example project's demo: seeded submissions settle through alarm-driven passes."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

import durable_agent
from durable_agent import lanes
from durable_agent.maintenance import alarm, repairs, run_pass
from durable_agent.models import DueLane, Host, PassRecord, Submission
from durable_agent.testing import FakeClock
from project.demo import lanes as demo_lanes
from project.demo.agents import DemoFailure
from tests.qdrive import drain_alarms

pytestmark = pytest.mark.django_db(transaction=True)


def test_seed_demo__submissions_settle_and_the_draft_waits_for_approval(clock: FakeClock) -> None:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert out.getvalue().strip().splitlines() == [
        "seeded 21 submissions on 3 hosts",
        "lane digest on billing-eu: parked; lane webhooks on notifier: failing",
    ]
    call_command("seed_demo", stdout=StringIO())  # idempotent: replayed keys admit nothing
    assert Submission.objects.count() == 21
    # Something to repair: a parked lane, and a lane whose every pass fails.
    assert DueLane.objects.get(host__key="billing-eu", lane="digest").state == "parked"
    notifier = Host.objects.get(key="notifier")
    slot = alarm.scheduled(notifier)
    assert slot is not None
    clock.set(max(slot, clock.now()))
    with pytest.raises(DemoFailure, match="503"):
        run_pass(notifier, deadline=slot, guard=True)
    assert PassRecord.objects.filter(host=notifier, phase="failed").exists()
    # The operator repairs both: the webhook endpoint is back, the digest is unparked.
    try:
        lanes.register("webhooks", lambda ctx: None)
        lanes.register("digest", lambda ctx: None)
        repairs.lane_unpark(host="billing-eu", lane="digest", reason="demo")
        drain_alarms(clock)
    finally:
        demo_lanes.register()
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
    assert not DueLane.objects.filter(due_at__isnull=False).exists()
