"""Exceptions raised by durable_agent.

One root, :class:`DurableAgentError`; one subclass per outcome a caller can act on. Each class
docstring is its default message and says how to fix the problem; ``code`` is stable and feeds
API error bodies; context travels as attributes.
"""

from __future__ import annotations

from typing import Any


class DurableAgentError(Exception):
    """durable_agent failed."""

    code = "durable_agent_error"

    def __init__(self, message: str | None = None, **context: Any) -> None:
        self.message = message or (self.__class__.__doc__ or "").strip().splitlines()[0]
        self.context = context
        for key, value in context.items():
            setattr(self, key, value)
        super().__init__(self.message)


class ConfigurationError(DurableAgentError):
    """A DURABLE_AGENT setting is invalid; run `manage.py check` for details."""

    code = "configuration_error"


class InvalidInput(DurableAgentError, ValueError):
    """An argument is invalid; nothing was written."""

    code = "invalid_input"


class InvalidLaneId(InvalidInput):
    """A lane id must be 1-256 characters of [A-Za-z0-9_.:-]; host lanes may not start with
    'agent:'."""

    code = "invalid_lane_id"


class InvalidDeadline(InvalidInput):
    """A deadline must be an aware datetime (UTC is used internally)."""

    code = "invalid_deadline"


class HostNotFound(DurableAgentError, LookupError):
    """No such host: create it with Host.objects.create(key=...) first."""

    code = "host_not_found"


class AlarmError(DurableAgentError):
    """An alarm transaction failed; nothing it wrote was committed."""

    code = "alarm_error"

    def __init__(self, operation: str, message: str | None = None, **context: Any) -> None:
        super().__init__(message, operation=operation, **context)
        self.operation = operation

    def __str__(self) -> str:
        return f"{self.operation}: {self.message}"


class RevisionConflict(AlarmError):
    """Maintenance due revision changed during transaction."""

    code = "revision_conflict"


class GateMisuse(AlarmError):
    """The mutation gate was used outside its transaction rules; see docs/gate.md."""

    code = "gate_misuse"


class RearmRefused(AlarmError):
    """The requested alarm time would postpone work that is already due earlier."""

    code = "rearm_refused"


class LaneNotRegistered(DurableAgentError):
    """No handler registered for scheduled lane; register it with durable_agent.lanes.register."""

    code = "lane_not_registered"


class BindingUnavailable(DurableAgentError):
    """The agent binding for this submission is not registered in this deployment."""

    code = "binding_unavailable"


class PassFailed(ExceptionGroup[Exception]):
    """A maintenance pass failed in more than one place; ``exceptions`` holds every failure.

    Raised by ``run_pass`` when, for example, an attempt failed and an admitted wave overran
    its allowance in the same pass: each failure is kept, in the order the pass met them
    (the native step's, then the concurrent waves', then the after-native waves'). Catch it
    with ``except PassFailed`` or ``except*``. A pass with a single failure raises that one.
    """

    code = "pass_failed"

    def __new__(cls, exceptions: list[Exception]) -> PassFailed:
        return super().__new__(cls, _describe_failures(exceptions), exceptions)

    def __init__(self, exceptions: list[Exception]) -> None:
        super().__init__(_describe_failures(exceptions), exceptions)

    def __str__(self) -> str:
        return self.message


def _describe_failures(exceptions: list[Exception]) -> str:
    parts = "; ".join(f"{type(exc).__name__}: {exc}" for exc in exceptions)
    return f"{len(exceptions)} failures: {parts}"


class WaitTimeout(DurableAgentError, TimeoutError):
    """The submission did not settle within the timeout of durable_agent.wait(); it is still
    queued or running: wait again, or read its state later."""

    code = "wait_timeout"
