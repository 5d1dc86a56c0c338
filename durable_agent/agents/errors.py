"""Exceptions of the reference runtime (each subclasses a ``durable_agent.errors`` class).

As everywhere in durable_agent: the class docstring is the default message and says how to fix
the problem, ``code`` is stable, and context travels as attributes. A service that raises one
of these wrote nothing.
"""

from __future__ import annotations

from durable_agent.errors import (
    BindingUnavailable,
    ConfigurationError,
    DurableAgentError,
    InvalidInput,
)


class AgentAlreadyRegistered(ConfigurationError):
    """Another function is already registered under this agent name and version; bump the
    version or unregister the old one."""

    code = "agent_already_registered"


class AgentNotRegistered(InvalidInput, BindingUnavailable):
    """No agent with this name and version is registered in this process; register it with
    @durable_agent.agent(name, version=...) in the agents.py of an installed app (found when
    Django starts), or in a module your AppConfig.ready() imports."""

    code = "agent_not_registered"


class InvalidPayload(InvalidInput):
    """The payload must be JSON-serialisable (dicts, lists, strings, finite numbers, booleans,
    None)."""

    code = "invalid_payload"


class PayloadTooLarge(InvalidInput):
    """The payload is larger than durable_agent.agents.services.MAX_PAYLOAD_BYTES once encoded
    as JSON; store large data elsewhere and submit a reference to it."""

    code = "payload_too_large"


class InvalidThreadKey(InvalidInput):
    """A thread key must be a string of 1 to 256 characters."""

    code = "invalid_thread_key"


class InvalidIdempotencyKey(InvalidInput):
    """An idempotency key must be a string of 1 to 200 characters (or None to generate one)."""

    code = "invalid_idempotency_key"


class IdempotencyConflict(InvalidInput):
    """This idempotency key was already used on this thread for a different agent or payload;
    use a new key for new work."""

    code = "idempotency_conflict"


class SubmissionNotFound(DurableAgentError, LookupError):
    """No such submission: pass a Submission or the id from its Receipt."""

    code = "submission_not_found"


class InvalidSubmissionState(InvalidInput):
    """The submission is not in a state that allows this operation."""

    code = "invalid_submission_state"


class LeaseLost(DurableAgentError):
    """This attempt no longer owns its submission (its lease expired and recovery took it
    back); stop without starting further side effects."""

    code = "lease_lost"


class TransactionMisuse(DurableAgentError):
    """This call must run outside transaction.atomic: its write has to commit on its own
    before the work that follows it."""

    code = "transaction_misuse"
