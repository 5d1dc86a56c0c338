"""What the durable_agent commands share: every error is one ``CommandError`` line.

Note [One error line per command]
    Django prints a ``CommandError`` as one ``CommandError: ...`` line on stderr and exits
    with its ``returncode``; any other exception is a traceback. :class:`DurableCommand` turns
    the errors an operator meets into ``CommandError``\\s: a database that is unreachable or
    not migrated (Django's ``DatabaseError``), and arguments the terminal could not decode
    (``$'\\xff'`` reaches Python as a lone surrogate, which no database driver can encode: the
    commands treat such a key or name as one that does not exist, before any query). With
    ``--json`` the error is also printed as one JSON object on stdout (``{"error": ...}``,
    plus the command's own empty result), unless the command already printed its JSON; so is
    an argument argparse refuses (its usage and message stay on stderr, exit status 2).
    The line stays the only output: ``--traceback`` still shows the traceback.
"""

from __future__ import annotations

import json
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, OperationalError, ProgrammingError

from durable_agent.text import error_text

DESCRIBED_CHARS = 2000
"""A printed error is cut to this many characters (as the pass records it)."""


def decodable(text: str) -> bool:
    """Whether ``text`` is valid Unicode (no lone surrogate from an undecodable argument)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(text: str) -> str:
    """``text`` safe to print: the bytes of an undecodable argument as ``\\xff`` escapes."""
    if decodable(text):
        return text
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def database_error(exc: DatabaseError) -> str:
    """One line saying what went wrong with the database and what to do."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, ProgrammingError) and (
        "does not exist" in first or "no such table" in first
    ):
        return f"The database is not migrated ({first}): run `manage.py migrate`"
    if isinstance(exc, OperationalError) and "no such table" in first:  # SQLite
        return f"The database is not migrated ({first}): run `manage.py migrate`"
    if isinstance(exc, OperationalError):
        return f"The database is unreachable: {first}"
    return f"Database error: {first}"


USAGE_ERROR = 2  # argparse's exit status


class DurableCommand(BaseCommand):
    """A command whose errors are one ``CommandError`` line (Note [One error line per
    command])."""

    #: The keys of the command's JSON result printed with an error (besides ``"error"``).
    json_on_error: dict[str, Any] = {}

    def run_from_argv(self, argv: list[str]) -> None:
        self.json_written = False
        try:
            super().run_from_argv(argv)
        except SystemExit as exc:
            # argparse's usage errors exit with status 2 before execute() runs.
            if exc.code == USAGE_ERROR and "--json" in argv[2:] and not self.json_written:
                self.write_json(
                    {
                        **self.json_on_error,
                        "error": "Invalid arguments: the usage is on stderr",
                        "code": "usage",
                    }
                )
            raise

    def execute(self, *args: Any, **options: Any) -> Any:
        self.json_written = False
        try:
            try:
                return super().execute(*args, **options)
            except DatabaseError as exc:
                raise CommandError(database_error(exc)) from exc
        except CommandError as exc:
            if options.get("json") and not self.json_written:
                data = {**self.json_on_error, "error": str(exc)}
                code = getattr(exc.__cause__, "code", None)
                if isinstance(code, str):
                    data["code"] = code
                self.write_json(data)
            raise

    def write_json(self, data: Any, *, indent: int | None = 2) -> None:
        """Print the command's JSON (once: an error after it adds no second object)."""
        self.stdout.write(json.dumps(data, indent=indent))
        self.stdout.flush()
        self.json_written = True


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` as the runtime stores it (``durable_agent.text.error_text``:
    never raising, an exception whose ``str()`` raises named by its type, a NUL or a lone
    surrogate shown as U+FFFD), so what a command prints matches the admin and the API."""
    return error_text(exc, limit=DESCRIBED_CHARS)
