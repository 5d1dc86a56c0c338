"""``manage.py maintenance_pass``: run maintenance passes now.

Note [Passes stream]
    Each host's line is printed (and flushed) as its pass finishes, so a long ``--all`` shows
    its progress and a pipe sees each line at once; on a terminal a ``[done/total]`` count
    on stderr follows the last line. A pass that raises, whatever it raises, is that host's
    ``FAILED`` line and the next host runs. Ctrl-C (``KeyboardInterrupt``) stops after the
    lines already printed and ends with a summary (with ``--json``: the JSON of the passes
    already run, ``"interrupted": true``); the exit status is then 130.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

from django.core.management.base import CommandError, CommandParser

from durable_agent.maintenance.passes import run_pass
from durable_agent.maintenance.store.selectors import hosts_for_pass
from durable_agent.management.commands._common import (
    DurableCommand,
    decodable,
    describe,
    shown,
)
from durable_agent.models import Host

INTERRUPTED = 130  # the shell's status for a command stopped by SIGINT


class Command(DurableCommand):
    help = (
        "Run a maintenance pass for hosts: --host KEY (repeatable), --due (hosts whose alarm is "
        "due), or --all. Prints one line per host as its pass finishes (a [done/total] count "
        "on a terminal), or JSON with --json (errors included). Ctrl-C stops with a summary "
        "of the passes already run. Exit status 1 when any pass failed or the selection is "
        "invalid, 130 when interrupted."
    )
    json_on_error = {"passes": [], "failed": 0}

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
            'the selection is invalid and "interrupted": true after Ctrl-C',
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            hosts = _selected(options)
        except KeyboardInterrupt:
            raise CommandError("Interrupted before any pass ran", returncode=INTERRUPTED) from None
        progress = _Progress(len(hosts)) if not options["json"] and _tty() else None
        results: list[dict[str, Any]] = []
        failed = 0
        running: str | None = None  # the host whose pass is under way
        try:
            for host in hosts:
                running = host.key
                result = _pass(host)
                running = None
                results.append(result)
                failed += not result["ok"]
                if not options["json"]:
                    if progress:
                        progress.clear()
                    self.stdout.write(_line(result))
                    self.stdout.flush()
                if progress:
                    progress.show(len(results))
        except KeyboardInterrupt:
            if progress:
                progress.clear()
            self._interrupted(options, results, failed, len(hosts), running)
        if progress:
            progress.clear()
        if options["json"]:
            self.write_json({"passes": results, "failed": failed})
        elif not results:
            self.stdout.write("no hosts")
        if failed:
            raise CommandError(f"{failed} of {len(results)} passes failed", returncode=1)

    def _interrupted(
        self,
        options: dict[str, Any],
        results: list[dict[str, Any]],
        failed: int,
        total: int,
        running: str | None,
    ) -> NoReturn:
        if options["json"]:
            self.write_json(
                {"passes": results, "failed": failed, "interrupted": True, "hosts": total}
            )
        cut = f" (the pass of {shown(running)} was cut short)" if running else ""
        raise CommandError(
            f"Interrupted after {len(results)} of {total} passes, {failed} failed{cut}",
            returncode=INTERRUPTED,
        )


def _selected(options: dict[str, Any]) -> list[Host]:
    """The hosts to run; an undecodable key is unknown (Note [One error line per command])."""
    keys: list[str] = options["host"]
    if any(not decodable(key) for key in keys):
        known = set(
            Host.objects.filter(key__in=[k for k in keys if decodable(k)]).values_list(
                "key", flat=True
            )
        )
        missing = [shown(key) for key in keys if key not in known]
        raise CommandError(f"Unknown host key(s): {', '.join(missing)}")
    try:
        return hosts_for_pass(keys=keys, due=options["due"], all=options["all"])
    except ValueError as exc:
        raise CommandError(str(exc)) from exc


def _pass(host: Host) -> dict[str, Any]:
    """One host's result: its report, or the error its pass raised (Note [Passes stream])."""
    try:
        report = run_pass(host)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # one host's failure never stops the others
        return {"host": host.key, "ok": False, "error": describe(exc)}
    return {"ok": True, **report.as_dict()}


def _tty() -> bool:
    return sys.stderr.isatty()


class _Progress:
    """A ``[done/total]`` count on the terminal's last line (stderr)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.shown = False

    def show(self, done: int) -> None:
        sys.stderr.write(f"\r[{done}/{self.total}]")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.shown = False


def _line(result: dict[str, Any]) -> str:
    if not result["ok"]:
        return f"{result['host']}: FAILED {result['error']}"
    return (
        f"{result['host']}: {result['phase']} settled={result['settled']} "
        f"recovered={result['recovered']} nonterminal={result['nonterminal']} "
        f"alarm={result['alarm'] or '-'} generation={result['generation']}"
    )
