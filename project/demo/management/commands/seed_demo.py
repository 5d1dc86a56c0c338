"""``manage.py seed_demo``: demo hosts, threads and submissions (idempotent)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

import durable_agent
from durable_agent.models import Host

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
