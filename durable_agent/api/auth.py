"""Who is asking: an API token (``Authorization: Bearer <secret>``) or a staff session.

Both schemes yield a :class:`Principal`. Reads need either. Every POST is a repair and needs
the token's ``repair`` scope, or a staff user with the ``durable_agent.repair_host``
permission (:func:`require_repair`). A session request with an unsafe method must pass
Django's CSRF check; a token request carries no ambient credentials and needs none.

The token scheme is tried first: a request that sends ``Authorization: Bearer`` is judged by
its token alone (a bad token is a 401, never a fallback to the session).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from durable_agent.api.errors import ApiError, not_authenticated
from durable_agent.api.tokens import authenticate_token
from durable_agent.models import ApiToken

REPAIR_PERMISSION = "durable_agent.repair_host"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a token or a user. ``actor`` is what audit rows record."""

    name: str
    actor: Any
    token: ApiToken | None = None
    user: Any = None

    @property
    def can_repair(self) -> bool:
        """A repair-scope token, or a user with the repair permission (asked only when needed:
        a permission check costs queries)."""
        if self.token is not None:
            return self.token.can_repair
        return self.user is not None and bool(self.user.has_perm(REPAIR_PERMISSION))


class TokenAuth(HttpBearer):
    """``Authorization: Bearer <secret>`` with a token from ``manage.py api_token create``."""

    def __call__(self, request: HttpRequest) -> Principal | None:
        value = request.headers.get(self.header)
        if not value:
            return None
        scheme, _, secret = value.partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.authenticate(request, secret.strip())

    def authenticate(self, request: HttpRequest, token: str) -> Principal:
        record = authenticate_token(token)
        if record is None:
            raise ApiError(
                401,
                "invalid_token",
                "The API token is unknown or revoked",
                headers={"WWW-Authenticate": 'Bearer realm="durable_agent", error="invalid_token"'},
            )
        return Principal(name=record.actor, actor=record.actor, token=record)


class StaffSessionAuth(APIKeyCookie):
    """A logged-in, active staff user (Django's session cookie), CSRF-checked when unsafe.

    The last scheme tried: it raises instead of returning None, so every failure has its own
    code (``not_authenticated``, ``not_staff``, ``csrf_failed``).
    """

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self) -> None:
        super().__init__(csrf=True)

    def __call__(self, request: HttpRequest) -> Principal:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            raise not_authenticated()
        if not (user.is_active and user.is_staff):
            raise ApiError(403, "not_staff", "The API is open to staff users only")
        if request.method not in SAFE_METHODS and check_csrf(request) is not None:
            raise ApiError(
                403,
                "csrf_failed",
                "CSRF check failed: send the csrftoken cookie's value in X-CSRFToken",
            )
        return Principal(name=user.get_username(), actor=user, user=user)

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:  # pragma: no cover
        raise NotImplementedError  # __call__ does the work


def principal(request: HttpRequest) -> Principal:
    """The request's principal (set by ninja once a scheme accepted the request)."""
    auth = getattr(request, "auth", None)
    if not isinstance(auth, Principal):
        raise not_authenticated()
    return auth


def require_repair(request: HttpRequest) -> Principal:
    """The principal, if it may repair; else a 403 ``insufficient_scope``."""
    caller = principal(request)
    if not caller.can_repair:
        raise ApiError(
            403,
            "insufficient_scope",
            "This request changes state: it needs a token with the repair scope, or a staff "
            f"user with the {REPAIR_PERMISSION} permission",
        )
    return caller


AUTH = [TokenAuth(), StaffSessionAuth()]
