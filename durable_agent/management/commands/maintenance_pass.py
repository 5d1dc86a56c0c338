"""``manage.py maintenance_pass``: run maintenance passes now."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durable_agent.maintenance.passes import run_pass
from durable_agent.maintenance.store.selectors import hosts_for_pass
from durable_agent.text import error_text


class Command(BaseCommand):
    help = (
        "Run a maintenance pass for hosts: --host KEY (repeatable), --due (hosts whose alarm is "
        "due), or --all. Prints one line per host, or JSON with --json (errors included). Exit "
        "status 1 when any pass failed or the selection is invalid."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--host",
            action="append",
            default=[],
            metavar="KEY",
            help="the host with this key; repeat for several (every key is checked first)",
        )
        parser.add_argument(
            "--due", action="store_true", help="hosts whose alarm slot is armed and due now"
        )
        parser.add_argument(
            "--all", action="store_true", help="every host (not with --host or --due)"
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help='print one JSON object: {"passes": [...], "failed": N}, plus "error" when '
            "the selection is invalid",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            hosts = hosts_for_pass(keys=options["host"], due=options["due"], all=options["all"])
        except ValueError as exc:
            if options["json"]:
                self.stdout.write(
                    json.dumps({"passes": [], "failed": 0, "error": str(exc)}, indent=2)
                )
            raise CommandError(str(exc)) from exc
        results: list[dict[str, Any]] = []
        failed = 0
        for host in hosts:
            try:
                report = run_pass(host)
            except Exception as exc:
                failed += 1
                results.append(
                    {"host": host.key, "ok": False, "error": error_text(exc, limit=2000)}
                )
                continue
            results.append({"ok": True, **report.as_dict()})
        if options["json"]:
            self.stdout.write(json.dumps({"passes": results, "failed": failed}, indent=2))
        else:
            for result in results:
                self.stdout.write(_line(result))
            if not results:
                self.stdout.write("no hosts")
        if failed:
            raise CommandError(f"{failed} of {len(results)} passes failed", returncode=1)


def _line(result: dict[str, Any]) -> str:
    if not result["ok"]:
        return f"{result['host']}: FAILED {result['error']}"
    return (
        f"{result['host']}: {result['phase']} settled={result['settled']} "
        f"recovered={result['recovered']} nonterminal={result['nonterminal']} "
        f"alarm={result['alarm'] or '-'} generation={result['generation']}"
    )
