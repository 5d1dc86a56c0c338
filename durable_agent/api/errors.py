"""The API's error contract: every error is ``{code, message, detail}`` with a stable code.

``DurableAgentError`` subclasses map to a status by their ``code`` (``STATUS_BY_CODE``), else
by their class (a lookup error is 404, an invalid input 422, anything else 500). Ninja's own
errors (validation, authentication, unparsable bodies) are re-shaped to the same body.

Note [Errors without the NinjaAPI]
    The app ships a Router, never a NinjaAPI, and ninja routes every exception raised by an
    operation (authentication, parsing, the view) to ``operation.api.on_exception``. So the
    router binds each of its operations to an :class:`ErrorContract`, a thin view of the
    project's NinjaAPI whose ``on_exception`` speaks this contract and which delegates
    everything else. The project's other routers, and its own exception handlers, are left
    alone. ``tests/api/test_errors.py`` pins the shapes, so a ninja upgrade that changes
    this path fails loudly.

Note [Refused before any work]
    Some answers come before ninja reads anything. The same view decorator that binds the
    contract answers 413 ``request_too_large`` for a ``Content-Length`` above Django's
    ``DATA_UPLOAD_MAX_MEMORY_SIZE``, before authentication, parsing or a query. A method the
    path does not have is 405 ``method_not_allowed`` from :class:`JsonPathView`, the class the
    router gives its path views (ninja's own answers text). A path under the mount that no
    route matches never reaches ninja: the project routes it to :func:`not_found`.

Size: the error contract (every status, schema and handler) is read best in one place.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from datetime import date, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError, transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.operation import PathView

from durable_agent.agents.services import MAX_PAYLOAD_DEPTH
from durable_agent.api.schemas import ErrorOut
from durable_agent.errors import DurableAgentError, InvalidInput

logger = logging.getLogger("durable_agent.api")

STATUS_BY_CODE: dict[str, int] = {
    # 400: the request cannot be read
    "bad_request": 400,
    "idempotency_key_mismatch": 400,
    # 401 / 403: who is asking, and may they
    "not_authenticated": 401,
    "invalid_token": 401,
    "forbidden": 403,
    "not_staff": 403,
    "csrf_failed": 403,
    "insufficient_scope": 403,
    # 404: an unknown path, host, lane, binding retry, fault or submission
    "not_found": 404,
    "host_not_found": 404,
    "repair_target_not_found": 404,
    "submission_not_found": 404,
    "token_not_found": 404,
    # 405: the path exists, the method does not
    "method_not_allowed": 405,
    # 409: the target exists but is not in a state this request applies to
    "not_repairable": 409,
    "rearm_refused": 409,
    "revision_conflict": 409,
    "invalid_submission_state": 409,
    "idempotency_conflict": 409,
    "binding_unavailable": 409,
    "lease_lost": 409,
    "token_name_taken": 409,
    # 413: the body is refused unread
    "request_too_large": 413,
    # 422: the request is well-formed but its values are not valid
    "validation_error": 422,
    "invalid_input": 422,
    "invalid_lane_id": 422,
    "invalid_deadline": 422,
    "invalid_thread_key": 422,
    "invalid_idempotency_key": 422,
    "invalid_payload": 422,
    "payload_too_large": 422,
    "agent_not_registered": 422,
    "invalid_token_name": 422,
    "invalid_cursor": 422,
    # 429: a throttle the project set on its NinjaAPI
    "throttled": 429,
    # 500: a bug or a broken deployment; details are logged, not returned
    "internal_error": 500,
    "pass_failed": 500,
    "durable_agent_error": 500,
    "configuration_error": 500,
    "alarm_error": 500,
    "gate_misuse": 500,
    "lane_not_registered": 500,
    "agent_already_registered": 500,
    "transaction_misuse": 500,
    "wait_timeout": 500,
    # 503: the database did not answer; retry after Retry-After seconds
    "database_unavailable": 503,
}

RETRY_AFTER_SECONDS = 5
"""The ``Retry-After`` of a 503 ``database_unavailable``."""

# Ninja's HttpError carries only a status (a project-wide throttle answers 429).
_CODE_BY_STATUS = {
    400: "bad_request",
    401: "not_authenticated",
    403: "forbidden",
    404: "not_found",
    429: "throttled",
}


class ApiError(Exception):
    """An error the API answers with ``status`` and ``{code, message, detail}``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        detail: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail or {}
        self.headers = headers or {}


ANY_REQUEST = (400, 413, 503)
"""Statuses any request may get: an unreadable request (a ``Content-Length`` that is not a
number, a body that is not JSON), a body too large, the database unavailable."""


def declared(*statuses: int) -> dict[int, type[ErrorOut]]:
    """The ``response=`` entries of an endpoint's error statuses (all :class:`ErrorOut`),
    with those of :data:`ANY_REQUEST`.

    An endpoint that authenticates (401) may also answer 429: refused tokens are limited per
    client address (``durable_agent/api/failures.py``).
    """
    limited = {429} if 401 in statuses else set()
    return dict.fromkeys(sorted({*statuses, *ANY_REQUEST, *limited}), ErrorOut)


def status_for(exc: DurableAgentError) -> int:
    """The HTTP status of a service error: by its code, else by its class."""
    status = STATUS_BY_CODE.get(exc.code)
    if status is not None:
        return status
    if isinstance(exc, LookupError):
        return 404
    if isinstance(exc, InvalidInput):
        return 422
    return 500


def jsonable(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON data (context attributes may hold models or datetimes)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if depth < 4 and isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if depth < 4 and isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, depth + 1) for v in value]
    return str(value)


def _location(loc: Any) -> list[str]:
    """``["body", "reason"]``, not ninja's ``["body", "body", "reason"]`` (every endpoint names
    its body parameter ``body``)."""
    parts = [str(part) for part in loc or ()]
    if parts[:2] == ["body", "body"]:
        del parts[1]
    return parts


def _validation_detail(exc: ValidationError) -> dict[str, Any]:
    errors = [
        {
            "loc": _location(error.get("loc")),
            "msg": str(error.get("msg", "")),
            "type": str(error.get("type", "")),
        }
        for error in exc.errors
    ]
    return {"errors": errors}


def database_unavailable() -> ApiError:
    return ApiError(
        503,
        "database_unavailable",
        f"The database is unavailable; retry in {RETRY_AFTER_SECONDS} s (a submission retried "
        "with the same idempotency key is admitted once)",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def _database_outage(exc: BaseException) -> bool:
    """``exc`` is, or was raised from, a database connection or operational failure."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, (OperationalError, InterfaceError)):
            return True
        seen = seen.__cause__
    return False


def request_too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        "request_too_large",
        f"The request body is larger than {limit} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE)",
        {"limit": limit},
    )


def to_api_error(exc: Exception) -> ApiError | None:
    """The contract's view of ``exc``; None for an unexpected exception (a 500)."""
    error = _to_api_error(exc)
    if (error is None or error.status >= 500) and _database_outage(exc):
        return database_unavailable()
    return error


def _to_api_error(exc: Exception) -> ApiError | None:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestDataTooBig):
        return request_too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)
    if isinstance(exc, DurableAgentError):
        detail = jsonable(exc.context)
        return ApiError(status_for(exc), exc.code, exc.message, detail)
    if isinstance(exc, ValidationError):
        return ApiError(
            422, "validation_error", "The request is not valid", _validation_detail(exc)
        )
    if isinstance(exc, AuthenticationError):
        return not_authenticated()
    if isinstance(exc, HttpError) and isinstance(exc.__cause__, RecursionError):
        return ApiError(  # ninja could not parse the body: it nests ~1000 levels or more
            422,
            "invalid_payload",
            f"The body nests too deep to read; a payload nests at most {MAX_PAYLOAD_DEPTH} levels",
            {"limit": MAX_PAYLOAD_DEPTH},
        )
    if isinstance(exc, HttpError):
        fallback = "internal_error" if exc.status_code >= 500 else "bad_request"
        code = _CODE_BY_STATUS.get(exc.status_code, fallback)
        return ApiError(exc.status_code, code, str(exc))
    if isinstance(exc, Http404):
        return ApiError(404, "not_found", "Not found")
    return None


def not_authenticated(message: str | None = None) -> ApiError:
    return ApiError(
        401,
        "not_authenticated",
        message
        or "Authenticate with an API token (Authorization: Bearer <secret>) or a staff session",
        headers={"WWW-Authenticate": 'Bearer realm="durable_agent"'},
    )


def error_body(error: ApiError) -> dict[str, Any]:
    return {"code": error.code, "message": error.message, "detail": error.detail}


def error_response(api: NinjaAPI, request: HttpRequest, exc: Exception) -> HttpResponse:
    """Render ``exc`` in the contract; unexpected exceptions are logged and become a 500."""
    error = to_api_error(exc)
    if error is None:
        error = ApiError(500, "internal_error", "Internal error; the server log has details")
    if error.status >= 500:
        logger.error(
            "%s in %s %s",
            error.code,
            request.method,
            request.path,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
    response = api.create_response(request, error_body(error), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    return response


class ErrorContract:
    """A view of a NinjaAPI whose ``on_exception`` speaks this module's contract.

    See Note [Errors without the NinjaAPI].
    """

    def __init__(self, api: NinjaAPI) -> None:
        self._api = api

    def on_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse:
        return error_response(self._api, request, exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


def bind_error_contract(run: Callable[..., Any]) -> Callable[..., Any]:
    """A router decorator (mode "view"): bind the operation to an :class:`ErrorContract`, and
    refuse an oversized body before the operation runs (Note [Refused before any work]).

    Ninja applies view decorators to ``operation.run`` (a bound method) once the operation is
    bound to its API; the operation itself is left as it was, apart from its ``api``.
    """
    operation = getattr(run, "__self__", None)
    api = getattr(operation, "api", None)
    if operation is None or api is None:
        return run
    contract = api if isinstance(api, ErrorContract) else ErrorContract(api)
    operation.api = contract

    @functools.wraps(run)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        refused = refuse_unread(request)
        if refused is not None:
            return contract.on_exception(request, refused)
        return run(request, *args, **kwargs)

    return guarded


def refuse_unread(request: HttpRequest) -> ApiError | None:
    """The error for a request refused on its headers alone (a body above Django's
    ``DATA_UPLOAD_MAX_MEMORY_SIZE``, an unreadable ``Content-Length``), else None."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    header = request.META.get("CONTENT_LENGTH") or "0"
    try:
        length = int(header)
    except (TypeError, ValueError):
        return ApiError(400, "bad_request", "The Content-Length header is not a number")
    if length < 0:
        return ApiError(400, "bad_request", "The Content-Length header is negative")
    if limit is not None and length > limit:
        return request_too_large(limit)
    return None


def _error_json(error: ApiError) -> JsonResponse:
    response = JsonResponse(error_body(error), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    return response


def method_not_allowed(allowed: Iterable[str]) -> JsonResponse:
    """405 ``method_not_allowed`` with the ``Allow`` header."""
    methods = sorted(set(allowed))
    return _error_json(
        ApiError(
            405,
            "method_not_allowed",
            f"This path answers {', '.join(methods)} only",
            {"allowed": methods},
            headers={"Allow": ", ".join(methods)},
        )
    )


class JsonPathView(PathView):
    """Ninja's view of one path, answering a method the path lacks in the contract.

    See Note [Refused before any work]. Its Django view also carries Django's
    ``transaction.non_atomic_requests`` marks of the path's endpoint functions (the aliases
    every one of them is marked for): Django reads them on the view the URL resolves to, which
    ninja builds per path and leaves unmarked, so ``ATOMIC_REQUESTS`` would otherwise wrap the
    endpoint in a transaction whatever the function says.
    """

    def _not_allowed(self) -> HttpResponse:
        return method_not_allowed(method for op in self.operations for method in op.methods)

    def get_view(self) -> Callable[..., Any]:
        view = super().get_view()
        marks: list[set[str]] = [
            getattr(op.view_func, "_non_atomic_requests", set()) for op in self.operations
        ]
        for alias in set.intersection(*marks) if marks else ():
            view = transaction.non_atomic_requests(using=alias)(view)
        return view

    def clone(self) -> PathView:
        cloned = super().clone()  # ninja builds a plain PathView; keep this class
        cloned.__class__ = JsonPathView
        return cloned


def answer_methods_in_contract(router: Any) -> None:
    """Give every path view of ``router`` (a ninja ``Router``) the class :class:`JsonPathView`."""
    for view in router.path_operations.values():
        if type(view) is PathView:
            view.__class__ = JsonPathView


def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """404 ``not_found`` in the contract: route every other path under the API's mount here.

    ::

        urlpatterns = [
            path("api/durable-agent/", not_found),  # the mount's root (ninja's is HTML)
            path("api/durable-agent/", api.urls),
            re_path(r"^api/durable-agent/", not_found),  # every path no route matched
        ]
    """
    return _error_json(ApiError(404, "not_found", f"No endpoint at {request.path}"))
