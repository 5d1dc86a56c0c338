"""Who is asking: an API token (``Authorization: Bearer <secret>``) or a staff session.

Both schemes yield a :class:`Principal`. A token's scope decides: ``read`` calls every GET,
``submit`` the submit endpoint and every GET but the submission reads (Note [What a submit
token reads]), ``repair`` every endpoint. A staff user needs,
on each endpoint, the Django model permission the admin asks for the same data (Note [Session
permissions]). Submitting needs the ``submit`` or ``repair`` scope (:func:`require_submit`);
every other POST is a repair and needs the token's ``repair`` scope; a staff user needs the
``durable_agent.repair_host`` permission for both (:func:`require_repair`). A session
request with an unsafe method must pass Django's CSRF check; a token request carries no
ambient credentials and needs none.

The token scheme is tried first: a request that sends ``Authorization: Bearer`` is judged by
its token alone (a bad token is a 401, never a fallback to the session). Refused tokens are
logged and limited per client address (``durable_agent.api.failures``).

Note [Session permissions]
    The admin shows hosts to users with ``view_host``, a host's lanes, binding retries,
    faults, audit rows and passes to users with their own view permission or ``view_host``,
    and threads and submissions only to users with ``view_submission`` (payloads may be
    private); its repair actions need ``repair_host`` and the list they run from.
    ``SESSION_PERMISSIONS`` gives each operation the same rule: any one of its permissions
    lets a staff user in (Django's view rule: the ``change_`` permission implies ``view_``).
    The router binds every operation's session scheme to its operation id
    (:func:`bind_permissions`); an operation missing from the table is refused to sessions,
    and a test fails until it is added.

Note [What a submit token reads]
    A ``submit`` token belongs to a producer: a service that hands work to agents. Submissions
    carry other producers' payloads and the agents' results and errors, which the admin shows
    only with ``view_submission``; a producer needs none of them to submit, and its receipt
    (id, thread, sequence, state) holds no payload. So a submit token reads what a staff user
    with ``view_host`` alone reads (hosts, their lanes and audit trail, health) and gets 403
    ``insufficient_scope`` from ``GET submissions`` and ``GET submissions/{id}``
    (:func:`require_submission_reader`). A producer that must follow its submissions' outcomes
    also holds a ``read`` token, which reads every submission by design.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from durable_agent.api import failures
from durable_agent.api.errors import ApiError, not_authenticated
from durable_agent.api.tokens import check_token
from durable_agent.models import ApiToken
from durable_agent.models.tokens import ApiTokenScope

REPAIR_PERMISSION = "durable_agent.repair_host"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def _viewers(*models: str) -> tuple[str, ...]:
    """The permissions that let a user view any of ``models`` in the admin."""
    return tuple(
        f"durable_agent.{action}_{model}" for model in models for action in ("view", "change")
    )


_HOSTS = _viewers("host")
_SUBMISSIONS = _viewers("submission")

SESSION_PERMISSIONS: dict[str, tuple[str, ...]] = {
    # reads: see Note [Session permissions]
    "list_hosts": _HOSTS,
    "get_host": _HOSTS,
    "list_host_lanes": _viewers("duelane", "host"),
    "list_host_audit": _viewers("alarmaudit", "host"),
    "health": _HOSTS,
    "get_submission": _SUBMISSIONS,
    "list_submissions": _SUBMISSIONS,
    # repairs (each needs repair_host as well): the list the admin action runs from
    "rearm_host": _HOSTS,
    "run_pass": _HOSTS,
    "unpark_lane": _viewers("duelane", "host"),
    "retry_binding": _viewers("bindingretry", "host"),
    "retry_fault": _viewers("recoveryfault", "host"),
    "abort_submission": _SUBMISSIONS,
    "approve_submission": _SUBMISSIONS,
    "resolve_submission": _SUBMISSIONS,
    # admits work and answers a receipt (no payload): repair_host alone
    "submit": (),
}
"""Operation id -> the permissions of which a staff user needs one (none: staff suffices)."""


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

    @property
    def can_read_submissions(self) -> bool:
        """A read- or repair-scope token, or a user (whose session scheme already asked for
        ``view_submission``): Note [What a submit token reads]."""
        if self.token is not None:
            return self.token.scope != ApiTokenScope.SUBMIT
        return self.user is not None

    @property
    def can_submit(self) -> bool:
        """A submit- or repair-scope token, or a user with the repair permission."""
        if self.token is not None:
            return self.token.can_submit
        return self.can_repair


class TokenAuth(HttpBearer):
    """``Authorization: Bearer <secret>`` with a token from ``manage.py api_token create``."""

    def __call__(self, request: HttpRequest) -> Principal | None:
        value = request.headers.get(self.header)
        if not value:
            return None
        scheme, _, secret = value.partition(" ")
        if scheme.lower() != "bearer":
            return None
        wait = failures.retry_after(request)
        if wait is not None:
            raise ApiError(
                429,
                "throttled",
                f"Too many refused API tokens from this address; retry after {wait} seconds",
                detail={"retry_after": wait},
                headers={"Retry-After": str(wait)},
            )
        return self.authenticate(request, secret.strip())

    def authenticate(self, request: HttpRequest, token: str) -> Principal:
        checked = check_token(token)
        if checked.token is None:
            failures.record(request, checked.reason)
            raise ApiError(
                401,
                "invalid_token",
                "The API token is unknown or revoked",
                headers={"WWW-Authenticate": 'Bearer realm="durable_agent", error="invalid_token"'},
            )
        record = checked.token
        return Principal(name=record.actor, actor=record.actor, token=record)


class StaffSessionAuth(APIKeyCookie):
    """A logged-in, active staff user (Django's session cookie), CSRF-checked when unsafe,
    with a permission of the operation (Note [Session permissions]).

    The last scheme tried: it raises instead of returning None, so every failure has its own
    code (``not_authenticated``, ``not_staff``, ``csrf_failed``, ``insufficient_scope``).
    """

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self, operation_id: str | None = None) -> None:
        super().__init__(csrf=True)
        self.operation_id = operation_id

    def for_operation(self, operation_id: str | None) -> StaffSessionAuth:
        """This scheme, checking the permissions of ``operation_id``."""
        return type(self)(operation_id)

    def _check_permissions(self, user: Any) -> None:
        needed = SESSION_PERMISSIONS.get(self.operation_id or "")
        if needed is None:  # an operation the table does not know: refused (fail closed)
            raise ApiError(
                403,
                "insufficient_scope",
                "This endpoint is not open to sessions; use an API token",
                detail={"operation": self.operation_id},
            )
        if needed and not any(user.has_perm(permission) for permission in needed):
            raise ApiError(
                403,
                "insufficient_scope",
                f"This endpoint needs one of the permissions {', '.join(needed)}",
                detail={"permissions": list(needed)},
            )

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
        self._check_permissions(user)
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


def require_submit(request: HttpRequest) -> Principal:
    """The principal, if it may submit work; else a 403 ``insufficient_scope``."""
    caller = principal(request)
    if not caller.can_submit:
        raise ApiError(
            403,
            "insufficient_scope",
            "Submitting work needs a token with the submit or repair scope, or a staff user "
            f"with the {REPAIR_PERMISSION} permission",
        )
    return caller


def require_submission_reader(request: HttpRequest) -> Principal:
    """The principal, if it may read submissions; else a 403 ``insufficient_scope`` (Note
    [What a submit token reads])."""
    caller = principal(request)
    if not caller.can_read_submissions:
        raise ApiError(
            403,
            "insufficient_scope",
            "Reading submissions (their payloads, results and errors) needs a token with the "
            "read or repair scope; a submit token submits work and reads hosts",
        )
    return caller


def bind_permissions(run: Callable[..., Any]) -> Callable[..., Any]:
    """A router decorator (mode "view"): bind the operation's session scheme to its operation
    id, so that it checks that operation's permissions (Note [Session permissions]).

    Ninja applies view decorators to ``operation.run`` (a bound method, or another view
    decorator's ``functools.wraps`` wrapper of it) once per mount; the operation's own list of
    schemes is replaced, ``run`` is returned as it was.
    """
    operation = getattr(inspect.unwrap(run), "__self__", None)
    callbacks = getattr(operation, "auth_callbacks", None)
    if operation is not None and callbacks:
        operation_id = getattr(operation, "operation_id", None)
        operation.auth_callbacks = [
            scheme.for_operation(operation_id) if isinstance(scheme, StaffSessionAuth) else scheme
            for scheme in callbacks
        ]
    return run


AUTH = [TokenAuth(), StaffSessionAuth()]
