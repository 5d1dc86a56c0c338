"""API token services: issue (the secret is shown once), revoke, list, authenticate.

A secret is ``da_`` followed by 43 URL-safe characters (32 random bytes). Only its SHA-256
digest is stored, so a database dump does not reveal a usable token; ``prefix`` (the first 10
characters) lets an operator recognise a token in ``manage.py api_token list``.

Note [A token name is never reused]
    Audit rows record the token that acted as ``token:NAME``. A new token under a revoked
    token's name would make the two indistinguishable in the audit trail, so a name, once
    issued, is refused to every later token (409 ``token_name_taken``, a ``CommandError`` in
    ``manage.py api_token create``), revoked or not. The database's unique constraint covers
    the active tokens only (two creations racing for a new name); revoked names are checked
    here, before the insert: a revoked token never becomes active again, so the check cannot
    go stale.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction

from durable_agent import clock
from durable_agent.errors import DurableAgentError, InvalidInput
from durable_agent.models.tokens import MAX_TOKEN_NAME_LENGTH, ApiToken, ApiTokenScope

SECRET_PREFIX = "da_"
SHOWN_PREFIX_LENGTH = 10
MAX_SECRET_LENGTH = 200
# last_used_at is written at most once per this interval per token (reads stay cheap).
LAST_USED_RESOLUTION = timedelta(seconds=60)
_NAME = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_TOKEN_NAME_LENGTH}}}")


class InvalidTokenName(InvalidInput):
    """A token name is 1-100 characters of [A-Za-z0-9_.-]."""

    code = "invalid_token_name"


class TokenNameTaken(InvalidInput):
    """A token, active or revoked, already has this name; choose another name (audit rows name
    a token ``token:NAME``, so a name is never given to a second token)."""

    code = "token_name_taken"


class TokenNotFound(DurableAgentError, LookupError):
    """No active token has this name; `manage.py api_token list` shows the names."""

    code = "token_not_found"


@dataclass(frozen=True)
class IssuedToken:
    """A new token and its secret. The secret is not stored: show it once."""

    token: ApiToken
    secret: str


def digest(secret: str) -> str:
    """The stored form of a secret: its SHA-256 hex digest."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _validate_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidTokenName(name=name)
    return name


def _validate_scope(scope: object) -> str:
    if scope not in ApiTokenScope.values:
        raise InvalidInput(
            f"A scope is one of {', '.join(ApiTokenScope.values)}, not {scope!r}", scope=scope
        )
    return str(scope)


def issue_token(*, name: str, scope: str) -> IssuedToken:
    """Create an active token called ``name`` with ``scope`` (``read``, ``submit`` or ``repair``).

    Raises:
        InvalidTokenName, InvalidInput (an unknown scope), TokenNameTaken (any token, revoked
        ones included, has this name: Note [A token name is never reused]).
    """
    name = _validate_name(name)
    scope = _validate_scope(scope)
    if ApiToken.objects.filter(name=name).exists():  # Note [A token name is never reused]
        raise TokenNameTaken(name=name)
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(
                name=name,
                scope=scope,
                digest=digest(secret),
                prefix=secret[:SHOWN_PREFIX_LENGTH],
                created_at=clock.now(),
            )
    except IntegrityError as exc:
        raise TokenNameTaken(name=name) from exc
    return IssuedToken(token=token, secret=secret)


def revoke_token(*, name: str) -> ApiToken:
    """Revoke the active token called ``name``; it stops working at once.

    Raises:
        TokenNotFound: no active token has this name.
    """
    token = ApiToken.objects.active().filter(name=name).first()
    if token is None:
        raise TokenNotFound(name=name)
    token.revoked_at = clock.now()
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=token.revoked_at)
    return token


def list_tokens(*, include_revoked: bool = False) -> list[ApiToken]:
    """Tokens by name (active ones only unless ``include_revoked``)."""
    tokens = ApiToken.objects.all() if include_revoked else ApiToken.objects.active()
    return list(tokens.order_by("name", "-created_at"))


@dataclass(frozen=True)
class TokenCheck:
    """What a secret authenticates: the active token, or None and why (``reason`` names no
    part of the secret; it may name a revoked token, whose name is not secret)."""

    token: ApiToken | None
    reason: str = ""


def check_token(secret: str) -> TokenCheck:
    """The active token whose secret is ``secret`` (noting when it was used), or why none."""
    if not secret:
        return TokenCheck(None, "empty token")
    if len(secret) > MAX_SECRET_LENGTH or not secret.isascii():
        return TokenCheck(None, "malformed token")
    token = ApiToken.objects.filter(digest=digest(secret)).first()
    if token is None:
        return TokenCheck(None, "unknown token")
    if token.revoked_at is not None:
        return TokenCheck(None, f"revoked token {token.name!r}")
    now = clock.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return TokenCheck(token)


def authenticate_token(secret: str) -> ApiToken | None:
    """The active token whose secret is ``secret``, else None; notes when it was used."""
    return check_token(secret).token
