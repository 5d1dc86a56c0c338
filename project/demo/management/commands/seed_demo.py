"""``manage.py seed_demo``: demo hosts, threads and submissions (idempotent)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

import durable_agent
from durable_agent import clock
from durable_agent.maintenance import alarm, gate, run_pass
from durable_agent.models import DueLane, Host
from durable_agent.testing import fake_clock
from project.demo.lanes import DIGEST, WEBHOOKS

SENTENCE = "durable agents keep every accepted input until it is processed exactly once"
WORDS = SENTENCE.split(" ")


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

    def park_digest(self, host: Host) -> str:
        """Park ``digest``: its 8 no-progress passes, run now on a clock that skips their
        backoff (1 s doubling), instead of over the next two minutes."""
        if DueLane.objects.filter(host=host, lane=DIGEST, state="parked").exists():
            return "parked"
        with fake_clock(clock.now()) as fake:
            gate.schedule(host, DIGEST, fake.now())
            for _ in range(12):
                if DueLane.objects.filter(host=host, lane=DIGEST, state="parked").exists():
                    break
                slot = alarm.scheduled(host)
                if slot is None:
                    break
                fake.set(max(slot, fake.now()))
                run_pass(host, deadline=slot, guard=True)
        return DueLane.objects.get(host=host, lane=DIGEST).state

    def fail_webhooks(self, host: Host) -> str:
        """Make ``webhooks`` due: every pass of ``notifier`` fails until it is repaired."""
        if not DueLane.objects.filter(host=host, lane=WEBHOOKS).exists():
            gate.schedule(host, WEBHOOKS, clock.now())
        return "failing"
