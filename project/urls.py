from django.contrib import admin
from django.urls import path, re_path
from django.views.generic import TemplateView

from durable_agent.api import not_found
from project.api import api

urlpatterns = [
    # templates/landing.html: links to the admin, the dashboard, the API docs and health.
    path("", TemplateView.as_view(template_name="landing.html"), name="landing"),
    path("admin/", admin.site.urls),
    # JSON 404s under the API's mount: its root (ninja's own answers HTML), then any path
    # none of the API's routes matched.
    path("api/durable-agent/", not_found),
    path("api/durable-agent/", api.urls),
    re_path(r"^api/durable-agent/", not_found),
]

try:  # the [metrics] extra (docs/operations.md); keep it on a path only Prometheus reaches
    from durable_agent.contrib.metrics import metrics_view
except ImportError:  # pragma: no cover - prometheus_client is not installed
    pass
else:
    urlpatterns.append(path("internal/metrics", metrics_view))
