"""``manage.py maintenance_audit``: check the alarm invariant on every host."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from durable_agent.maintenance.operators.audit import audit_all, repair_host
from durable_agent.management.commands._common import DurableCommand
from durable_agent.models import Host
from durable_agent.runtime import get_runtime


class Command(DurableCommand):
    help = (
        "Check that every host with owed work holds an alarm early enough, and that no host is "
        "failing (its last FAILING_AFTER_PASSES passes failed). Also reports overdue slots, "
        "parked lanes, expired mutation tickets and stale pass leases. Exit status 1 on a "
        "violation or a failing host; --repair re-arms violating hosts (audited) and says what "
        "changed (it cannot fix a failing host: fix the error it reports). Any other error is "
        "one CommandError line (a JSON object with --json)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the audit as JSON")
        parser.add_argument("--repair", action="store_true", help="re-arm violating hosts")
        parser.add_argument(
            "--fail-on-attention",
            action="store_true",
            help="also exit 1 when work waits for a person (unknown or suspended submissions, "
            "heads parked on a missing agent binding, failing hosts)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        registry_key = get_runtime().binding_registry_key()
        summary = audit_all(registry_key=registry_key)
        repaired: list[dict[str, Any]] = []
        if options["repair"]:
            for audit in summary.violating:
                host = Host.objects.select_related("alarm").get(key=audit.host)
                slot = repair_host(host, reason="maintenance_audit --repair")
                repaired.append(
                    {
                        "host": audit.host,
                        "before": audit.slot.isoformat() if audit.slot else None,
                        "after": slot.isoformat() if slot else None,
                    }
                )
            after = audit_all(registry_key=registry_key)
        else:
            after = summary
        if options["json"]:
            data = summary.as_dict()
            if options["repair"]:
                data["repaired"] = repaired
                data["ok_after_repair"] = after.ok
            self.write_json(data)
        else:
            self._print(summary, repaired)
        if not after.ok:
            raise CommandError(
                problems_line(after.hosts, len(after.violating), len(after.failing)),
                returncode=1,
            )
        if options["fail_on_attention"] and after.degraded:
            raise CommandError(
                f"Work waits for an operator: {after.attention.describe()}", returncode=1
            )

    def _print(self, summary: Any, repaired: list[dict[str, Any]]) -> None:
        self.stdout.write(
            f"hosts: {summary.hosts}, violating: {len(summary.violating)}, "
            f"failing: {len(summary.failing)}"
        )
        for audit in summary.violating:
            for violation in audit.violations:
                self.stdout.write(f"VIOLATION {audit.host}: {violation}")
        for audit in summary.failing:
            self.stdout.write(
                f"FAILING {audit.host}: {audit.failed_passes} passes failed in a row; "
                f"last error: {audit.last_error}"
            )
        for host in summary.overdue:
            self.stdout.write(f"overdue {host}: its alarm is more than 60 s late")
        for host, lanes in summary.parked.items():
            self.stdout.write(f"parked {host}: {', '.join(lanes)}")
        if summary.expired_tickets:
            self.stdout.write(f"expired mutation tickets: {summary.expired_tickets}")
        for host in summary.stale_leases:
            self.stdout.write(f"stale pass lease {host}")
        if summary.degraded:
            self.stdout.write(f"ATTENTION: {summary.attention.describe()}")
        for change in repaired:
            self.stdout.write(
                f"repaired {change['host']}: alarm {change['before'] or 'disarmed'} -> "
                f"{change['after'] or 'disarmed'}"
            )


def problems_line(hosts: int, violating: int, failing: int) -> str:
    """``"Of 3 hosts, 1 violates the alarm invariant and 2 are failing"``, in singular where
    a count is 1."""
    problems = []
    if violating:
        verb = "violates" if violating == 1 else "violate"
        problems.append(f"{violating} {verb} the alarm invariant")
    if failing:
        problems.append(f"{failing} {'is' if failing == 1 else 'are'} failing")
    return f"Of {hosts} host{'' if hosts == 1 else 's'}, {' and '.join(problems)}"
