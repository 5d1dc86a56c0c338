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
"""

from __future__ import annotations

from ninja import Router

from durable_agent.api import hosts, repairs, submissions
from durable_agent.api.auth import AUTH, bind_permissions
from durable_agent.api.errors import answer_methods_in_contract, bind_error_contract, not_found

__all__ = ["not_found", "router"]

router = Router(auth=AUTH)
router.add_decorator(bind_permissions, mode="view")
router.add_decorator(bind_error_contract, mode="view")
router.add_router("", hosts.router)
router.add_router("", repairs.router)
router.add_router("", submissions.router)
for _module in (hosts, repairs, submissions):
    answer_methods_in_contract(_module.router)
