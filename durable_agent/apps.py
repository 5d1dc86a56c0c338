from django.apps import AppConfig


class DurableAgentConfig(AppConfig):
    name = "durable_agent"
    verbose_name = "Durable agent"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from durable_agent import checks  # noqa: F401  (registers the system checks)
