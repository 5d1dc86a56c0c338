from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench.benchapp"
    label = "benchapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import os

        if os.environ.get("BENCH_ERROR_DIR"):
            from bench import faults

            faults.install()  # error accounting in every process of the soak or a benchmark
        if os.environ.get("BENCH_TRACE_DIR"):
            from bench import trace

            trace.install()  # bench/immediate.py --profile: spans and statements of each pass
        from bench.benchapp import agents  # noqa: F401  (registers the soak agents)
        from durable_agent import lanes

        lanes.register("bench", lambda ctx: None)
        lanes.register("burst", _burst)


def _burst(ctx: object) -> None:
    """The burst lane (bench/burst.py): one row per wave, the work the bench waits for."""
    from bench.benchapp.models import Fact

    Fact.objects.create(host_id=ctx.host.pk)  # type: ignore[attr-defined]


def noop(*args: object) -> None:
    """A task that does nothing (the async_task comparison enqueues it)."""
