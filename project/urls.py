from django.contrib import admin
from django.urls import path, re_path

from durable_agent.api import not_found
from project.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    # JSON 404s under the API's mount: its root (ninja's own answers HTML), then any path
    # none of the API's routes matched.
    path("api/durable-agent/", not_found),
    path("api/durable-agent/", api.urls),
    re_path(r"^api/durable-agent/", not_found),
]
