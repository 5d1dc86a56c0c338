"""``manage.py seed_demo``: demo hosts, threads and submissions (idempotent).

Note [The demo's history is in the past, its lateness the cluster's]
    The dashboard's lateness histogram reads the lateness of passes that alarms fired. The
    seed records none: the digest lane's passes run on a clock that starts in the past (so
    no pass is dated in the future) and without a deadline; the passes of the work it
    submits, and of any alarm that fell due while no demo ran, are run by the seed itself,
    without a deadline (as ``manage.py maintenance_pass --due`` does); the webhooks lane
    first falls due a little after the seed, once the cluster runs. What the histogram
    shows is the cluster's own lateness.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand

import durable_agent
from durable_agent import clock
from durable_agent.maintenance import alarm, gate, run_pass, selectors
from durable_agent.models import DueLane, Host
from durable_agent.testing import fake_clock
from project.demo.lanes import DIGEST, WEBHOOKS

SENTENCE = "durable agents keep every accepted input until it is processed exactly once"
WORDS = SENTENCE.split(" ")
#: How long before now the digest lane's seeded passes start (they span about 4 minutes).
HISTORY_START = timedelta(minutes=10)
#: The seed runs the passes of alarms due within this much of now.
DUE_AHEAD = timedelta(seconds=1)
#: At most this many rounds of catch-up passes.
CATCH_UP_ROUNDS = 20
#: When the webhooks lane first falls due: after the cluster has started.
WEBHOOKS_FIRST_DUE = timedelta(seconds=30)


class Command(BaseCommand):
    help = "Create demo hosts with submissions for the example agents (safe to run twice)."

    def handle(self, *args: Any, **options: Any) -> None:
        created = 0
        for key, single in (("support-desk", False), ("research-bot", True), ("newsroom", False)):
            host, _ = Host.objects.get_or_create(key=key, defaults={"single_thread": single})
            for n in range(3):
                thread = f"{key}-thread-{n}"
                jobs = [
                    ("summarise", {"text": " ".join(WORDS[n:] + WORDS[:n])}),
                    ("flaky-tool", {"query": f"{key} question {n}"}),
                ]
                if key == "newsroom":
                    jobs.append(("publish-draft", {"title": f"Issue {n}"}))
                for i, (agent, payload) in enumerate(jobs):
                    receipt = durable_agent.submit(
                        host=host,
                        thread=thread,
                        agent=agent,
                        payload=payload,
                        idempotency_key=f"demo-{thread}-{i}",
                    )
                    created += receipt.created
        self.stdout.write(f"seeded {created} submissions on 3 hosts")
        parked = self.park_digest(Host.objects.get_or_create(key="billing-eu")[0])
        failing = self.fail_webhooks(Host.objects.get_or_create(key="notifier")[0])
        self.stdout.write(
            f"lane {DIGEST} on billing-eu: {parked}; lane {WEBHOOKS} on notifier: {failing}"
        )
        self.run_due()

    def run_due(self) -> None:
        """Run the passes already due, before the cluster starts: Note [The demo's history
        is in the past, its lateness the cluster's]."""
        # A new alarm is armed at least ceil(ALARM_BACKOFF_BASE_MS / 2) ahead: look a second
        # on; a pass serves a bounded share of a host's work, so run rounds until none is due.
        failed: set[int] = set()
        for _ in range(CATCH_UP_ROUNDS):
            due = [
                h for h in selectors.due_hosts(now=clock.now() + DUE_AHEAD) if h.pk not in failed
            ]
            if not due:
                break
            earliest = min(h.alarm.next_run for h in due if h.alarm)
            wait = (earliest - clock.now()).total_seconds()
            time.sleep(max(0.0, min(wait, DUE_AHEAD.total_seconds())))
            for host in due:
                try:
                    run_pass(host)
                except Exception:  # a demo failure (webhooks): the cluster retries it
                    failed.add(host.pk)
            if clock.now() < earliest:  # a clock that does not follow time (a test's)
                break

    def park_digest(self, host: Host) -> str:
        """Park ``digest``: its 8 no-progress passes, run now on a clock that skips their
        backoff (1 s doubling), instead of over the next few minutes. That clock starts
        :data:`HISTORY_START` ago, so the passes it records are dated in the past."""
        if DueLane.objects.filter(host=host, lane=DIGEST, state="parked").exists():
            return "parked"
        with fake_clock(clock.now() - HISTORY_START) as fake:
            gate.schedule(host, DIGEST, fake.now())
            for _ in range(12):
                if DueLane.objects.filter(host=host, lane=DIGEST, state="parked").exists():
                    break
                slot = alarm.scheduled(host)
                if slot is None:
                    break
                fake.set(max(slot, fake.now()))
                run_pass(host)  # no deadline: the seed records no lateness
        return DueLane.objects.get(host=host, lane=DIGEST).state

    def fail_webhooks(self, host: Host) -> str:
        """Make ``webhooks`` due: every pass of ``notifier`` fails until it is repaired."""
        if not DueLane.objects.filter(host=host, lane=WEBHOOKS).exists():
            gate.schedule(host, WEBHOOKS, clock.now() + WEBHOOKS_FIRST_DUE)
        return "failing"
