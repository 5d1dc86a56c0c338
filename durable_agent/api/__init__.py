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
"""

from __future__ import annotations

from ninja import Router

from durable_agent.api import hosts, repairs, submissions
from durable_agent.api.auth import AUTH, bind_permissions
from durable_agent.api.errors import bind_error_contract

__all__ = ["router"]

router = Router(auth=AUTH)
router.add_decorator(bind_permissions, mode="view")
router.add_decorator(bind_error_contract, mode="view")
router.add_router("", hosts.router)
router.add_router("", repairs.router)
router.add_router("", submissions.router)
