from durable_agent import lanes


def _run(ctx):  # type: ignore[no-untyped-def]
    return None


lanes.register("autodiscovered", _run)
