"""The HTTP API: a django-ninja ``Router`` for the project to mount.

Mount it on the project's ``NinjaAPI`` (the app never creates one)::

    from ninja import NinjaAPI
    from durable_agent.api import router

    api = NinjaAPI(urls_namespace="durable_agent_api", docs_url="docs")
    api.add_router("", router)
    urlpatterns = [
        path("api/durable-agent/", not_found),  # JSON 404s: the mount's root, and ...
        path("api/durable-agent/", api.urls),
        re_path(r"^api/durable-agent/", not_found),  # ... every path no route matched
    ]

Every endpoint needs an API token (``Authorization: Bearer <secret>``, see
``manage.py api_token``) or a staff session; every POST needs the repair scope. Every error
is ``{code, message, detail}``, a wrong method (405) and an oversized body (413)
included; ``docs/api.md`` lists the codes and their statuses.

The API needs django-ninja, the ``api`` extra (``pip install ".[api]"`` in a checkout). Nothing
else does: this package imports ninja only when ``router`` or ``not_found`` is first read, so
``durable_agent.api.tokens`` and ``manage.py api_token`` work without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ninja import Router

    from durable_agent.api.errors import not_found

__all__ = ["not_found", "router"]

_router: Router | None = None


def _require_ninja() -> None:
    try:
        import ninja  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "ninja":
            raise
        raise ModuleNotFoundError(
            "durable_agent.api needs django-ninja, the 'api' extra: pip install '.[api]' in a "
            "checkout of durable_agent, or its wheel with [api] (README.md, Install)",
            name="ninja",
        ) from exc


def _build_router() -> Router:
    _require_ninja()
    from ninja import Router

    # deferred: optional extra - these import django-ninja, checked by _require_ninja() above
    from durable_agent.api import hosts, repairs, submissions
    from durable_agent.api.auth import AUTH, bind_permissions
    from durable_agent.api.errors import answer_methods_in_contract, bind_error_contract

    router = Router(auth=AUTH)
    router.add_decorator(bind_permissions, mode="view")
    router.add_decorator(bind_error_contract, mode="view")
    router.add_router("", hosts.router)
    router.add_router("", repairs.router)
    router.add_router("", submissions.router)
    for module in (hosts, repairs, submissions):
        answer_methods_in_contract(module.router)
    return router


def __getattr__(name: str) -> Any:
    global _router
    if name == "not_found":
        _require_ninja()
        from durable_agent.api.errors import not_found  # deferred: optional extra (ninja)

        return not_found
    if name != "router":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _router is None:
        _router = _build_router()
    return _router
