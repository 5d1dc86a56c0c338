from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The example project's agents and lanes: registered at startup in every process."""

    name = "project.demo"
    label = "demo"

    def ready(self) -> None:
        # Importing agents registers the example agents; lanes registers its two lanes.
        from project.demo import agents, lanes  # noqa: F401

        lanes.register()
