import contextlib

from django.apps import AppConfig


class DurableAgentConfig(AppConfig):
    name = "durable_agent"
    verbose_name = "Durable agent"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        # deferred: Django - checks imports models; the app registry is not ready at apps.py load
        from durable_agent import checks  # noqa: F401  (registers the system checks)

        # Each installed app's agents.py and lanes.py register at import, as admin.py does.
        autodiscover_modules("agents", "lanes")

        # The Prometheus pass metrics listen to pass_finished, when prometheus_client is installed.
        with contextlib.suppress(ImportError):
            # deferred: optional extra (prometheus_client); the app registry is ready only here
            from durable_agent.contrib import metrics  # noqa: F401
