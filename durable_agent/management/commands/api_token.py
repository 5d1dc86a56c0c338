"""``manage.py api_token``: create, list and revoke tokens of the HTTP API."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from durable_agent.api.tokens import TokenNotFound, issue_token, list_tokens, revoke_token
from durable_agent.errors import DurableAgentError
from durable_agent.management.commands._common import DurableCommand, decodable
from durable_agent.models import ApiToken
from durable_agent.models.tokens import ApiTokenScope


def _row(token: ApiToken) -> dict[str, Any]:
    return {
        "name": token.name,
        "scope": token.scope,
        "prefix": token.prefix,
        "created_at": token.created_at.isoformat(),
        "last_used_at": token.last_used_at.isoformat() if token.last_used_at else None,
        "revoked_at": token.revoked_at.isoformat() if token.revoked_at else None,
    }


class Command(DurableCommand):
    help = (
        "Manage tokens of the HTTP API. `create NAME --scope read|submit|repair` prints the secret "
        "once (only its SHA-256 digest is stored); `list` shows names, scopes and prefixes; "
        "`revoke NAME` disables a token at once. Errors are one CommandError line (a JSON "
        "object with --json)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="create a token and print its secret once")
        create.add_argument("name", help="1-100 characters of [A-Za-z0-9_.-]")
        create.add_argument(
            "--scope",
            choices=ApiTokenScope.values,
            required=True,
            help=(
                "read: GET endpoints only; submit: GET endpoints and submitting work; "
                "repair: every endpoint"
            ),
        )
        create.add_argument("--json", action="store_true", help="print JSON")
        listing = actions.add_parser("list", help="list tokens (never their secrets)")
        listing.add_argument("--all", action="store_true", help="include revoked tokens")
        listing.add_argument("--json", action="store_true", help="print JSON")
        revoke = actions.add_parser("revoke", help="revoke a token by name")
        revoke.add_argument("name")
        revoke.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['action']}")(options)
        except DurableAgentError as exc:
            raise CommandError(exc.message) from exc

    def _create(self, options: dict[str, Any]) -> None:
        issued = issue_token(name=options["name"], scope=options["scope"])
        if options["json"]:
            self.write_json({**_row(issued.token), "secret": issued.secret}, indent=None)
            return
        self.stdout.write(f"Created token {issued.token.name!r} (scope {issued.token.scope}).")
        self.stdout.write("Its secret is shown once; store it now:")
        self.stdout.write(issued.secret)

    def _list(self, options: dict[str, Any]) -> None:
        tokens = list_tokens(include_revoked=options["all"])
        if options["json"]:
            self.write_json([_row(token) for token in tokens])
            return
        if not tokens:
            self.stdout.write("No tokens.")
        for token in tokens:
            used = token.last_used_at.isoformat() if token.last_used_at else "never"
            state = f" revoked {token.revoked_at.isoformat()}" if token.revoked_at else ""
            self.stdout.write(
                f"{token.name}\t{token.scope}\t{token.prefix}...\tlast used {used}{state}"
            )

    def _revoke(self, options: dict[str, Any]) -> None:
        if not decodable(options["name"]):  # Note [One error line per command]
            raise TokenNotFound(name=options["name"])
        token = revoke_token(name=options["name"])
        if options["json"]:
            self.write_json(_row(token), indent=None)
            return
        self.stdout.write(f"Revoked token {token.name!r}.")
