from django.apps import AppConfig


class PeersConfig(AppConfig):
    name = "bench.peers"
    label = "peers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from bench.peers.tasks import LANE, run_lane
        from durable_agent import lanes

        lanes.register(LANE, run_lane)
