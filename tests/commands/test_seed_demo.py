"""The demo's seed records no future history and leaves no alarm due for the cluster to
fire late (Note [The demo's history is in the past, its lateness the cluster's] in
project/demo/management/commands/seed_demo.py)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from durable_agent import clock as real_clock
from durable_agent.maintenance import selectors
from durable_agent.models import PassRecord
from durable_agent.testing import FakeClock
from project.demo.management.commands import seed_demo

pytestmark = pytest.mark.django_db(transaction=True)


def test_seed_demo__its_pass_history_is_dated_in_the_past_without_lateness() -> None:
    call_command("seed_demo", stdout=StringIO())
    now = real_clock.now()
    started = list(PassRecord.objects.values_list("started_at", flat=True))
    assert len(started) >= 8  # the digest lane's passes, and the seeded work's
    assert max(started) <= now
    assert set(PassRecord.objects.values_list("lateness_ms", flat=True)) == {None}


def test_seed_demo__no_alarm_falls_due_before_the_cluster_starts() -> None:
    call_command("seed_demo", stdout=StringIO())
    now = real_clock.now()
    # What the seed left due within the next second it would have run: the cluster, started
    # after it, fires only alarms that fall due once it runs.
    assert selectors.due_hosts(now=now + seed_demo.DUE_AHEAD) == []
    # The webhooks lane (failing on purpose) falls due later, for the cluster to fire.
    later = [h.key for h in selectors.due_hosts(now=now + seed_demo.WEBHOOKS_FIRST_DUE)]
    assert later == ["notifier"]


def test_seed_demo__a_second_seed_catches_up_what_fell_due_meanwhile(clock: FakeClock) -> None:
    call_command("seed_demo", stdout=StringIO())
    clock.advance(minutes=90)  # the demo was stopped; make demo again
    assert selectors.due_hosts()
    call_command("seed_demo", stdout=StringIO())
    assert selectors.due_hosts() == []
