import durable_agent


@durable_agent.agent("autodiscovered", version="1")
def autodiscovered(ctx, payload):  # type: ignore[no-untyped-def]
    return payload
