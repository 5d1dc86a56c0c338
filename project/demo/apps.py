from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The example project's agents: imported at startup so every process registers them."""

    name = "project.demo"
    label = "demo"

    def ready(self) -> None:
        from project.demo import agents  # noqa: F401  (registers the example agents)
