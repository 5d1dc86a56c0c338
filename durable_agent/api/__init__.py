"""The HTTP API: a django-ninja ``Router`` for the project to mount.

Mount it on the project's ``NinjaAPI`` (the app never creates one)::

    from ninja import NinjaAPI
    from durable_agent.api import router

    api = NinjaAPI(urls_namespace="durable_agent_api", docs_url="docs")
    api.add_router("", router)
    urlpatterns = [path("api/durable-agent/", api.urls)]

Every endpoint needs an API token (``Authorization: Bearer <secret>``, see
``manage.py api_token``) or a staff session; every POST needs the repair scope. Every error
is ``{code, message, detail}``; ``docs/api.md`` lists the codes and their statuses.

The API needs django-ninja, the ``api`` extra (``pip install "durable-agent[api]"``). Nothing
else does: this package imports ninja only when ``router`` is first read, so
``durable_agent.api.tokens`` and ``manage.py api_token`` work without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ninja import Router

__all__ = ["router"]

_router: Router | None = None


def _build_router() -> Router:
    try:
        from ninja import Router
    except ModuleNotFoundError as exc:
        if exc.name != "ninja":
            raise
        raise ModuleNotFoundError(
            "durable_agent.api needs django-ninja: pip install 'durable-agent[api]'",
            name="ninja",
        ) from exc

    from durable_agent.api import hosts, repairs, submissions
    from durable_agent.api.auth import AUTH
    from durable_agent.api.errors import bind_error_contract

    router = Router(auth=AUTH)
    router.add_decorator(bind_error_contract, mode="view")
    router.add_router("", hosts.router)
    router.add_router("", repairs.router)
    router.add_router("", submissions.router)
    return router


def __getattr__(name: str) -> Any:
    global _router
    if name != "router":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _router is None:
        _router = _build_router()
    return _router
