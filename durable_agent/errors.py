"""Exceptions raised by durable_agent.

One root, :class:`DurableAgentError`; one subclass per outcome a caller can act on. Each class
docstring is its default message and says how to fix the problem; ``code`` is stable and feeds
API error bodies; context travels as attributes.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.db import Error as DatabaseError
from django_q.exceptions import TimeoutException


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


class PassError(DurableAgentError):
    """A maintenance pass failed; the host was re-armed with a backoff.

    Raised in place of a failure that cannot travel on as it is: by ``run_pass`` when code it
    ran (a lane, a signal receiver, the runtime) raised a ``BaseException`` that is not an
    ``Exception`` (``SystemExit``, a ``BaseExceptionGroup``, ...), so that every caller that
    handles ``Exception`` handles it too; and by the alarm task ``fire_alarm``, so that
    django-q stores a failed pass's description, storable, whatever the failure's own
    ``__str__`` does. The message is the failure's description; the original is
    ``__cause__`` (``run_pass``), or ``__context__`` and the log (``fire_alarm``). See docs/pass.md
    "What code raises".
    """

    code = "pass_failed"


def _describe_failures(exceptions: list[Exception]) -> str:
    parts = "; ".join(describe_error(exc) for exc in exceptions)
    return f"{len(exceptions)} failures: {parts}"


# Note [Describing an error]
#     An error's text is read in one place, and reading it never raises: ``str()`` runs the
#     exception's own ``__str__`` (agent or lane code, which may raise anything), so a failure
#     of it is described by the exception's type name instead. A database error keeps only its
#     first line, the server's primary message: the lines after it (PostgreSQL's ``LINE 1:``,
#     ``DETAIL:`` and ``CONTEXT:``) quote the failed statement and its values. A group lists
#     its leaves. The text may still hold what no database can store (a NUL character, a lone
#     surrogate): whoever stores it passes it through ``durable_agent.text.storable``.

#: Leaves of an exception group that its description lists.
MAX_DESCRIBED_LEAVES = 5


def type_name(exc: BaseException) -> str:
    """The name of ``exc``'s type, never raising (Note [Describing an error])."""
    try:
        name = type(exc).__name__
        if isinstance(name, str):
            return str.__str__(name)
    except BaseException:  # a hostile metaclass; the fallback says enough
        pass
    return "BaseException"


def error_message(exc: BaseException) -> str:
    """``str(exc)``, never raising (Note [Describing an error])."""
    try:
        text = str.__str__(str(exc))
    except BaseException as failure:  # any __str__ may raise anything
        return f"(the message of this {type_name(exc)} could not be read: {type_name(failure)})"
    if isinstance(exc, DatabaseError):
        text = text.strip().split("\n", 1)[0]
    if isinstance(exc, BaseExceptionGroup) and type(exc).__str__ is BaseExceptionGroup.__str__:
        leaves = [describe_error(leaf) for leaf in exc.exceptions[:MAX_DESCRIBED_LEAVES]]
        more = len(exc.exceptions) - MAX_DESCRIBED_LEAVES
        text = f"{text}: {'; '.join(leaves)}" + (f"; and {more} more" if more > 0 else "")
    return text


def describe_error(exc: BaseException) -> str:
    """``"TypeName: message"`` (or the type name alone), never raising (Note [Describing an
    error]); what the pass records, logs and prints for a failure."""
    name, message = type_name(exc), error_message(exc)
    return f"{name}: {message}" if message else name


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds, nested groups flattened; ``[exc]`` otherwise."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    return [leaf for inner in exc.exceptions for leaf in leaves(inner)]


def is_stop(exc: BaseException) -> bool:
    """Is ``exc`` (or a leaf of it) the process being stopped, rather than code failing?

    Note [A stop is not a failure]
        Python delivers signals only to the main thread, so only there can an interruption
        be a stop: django-q's ``TimeoutException`` (its task timeout, raised by SIGALRM), or a
        ``KeyboardInterrupt`` while SIGINT has Python's default handler (Ctrl-C). Anything
        else that is not an ``Exception`` was raised by code: a ``SystemExit`` from
        ``sys.exit()``, a ``KeyboardInterrupt`` in a django-q worker (which ignores SIGINT)
        or on a pass's pool thread, a ``BaseExceptionGroup``. django-q stops its workers with
        SIGTERM at its default disposition: the process ends without any exception. A stop is
        never settled as an agent's failure nor turned into an ``Exception``; it propagates,
        and the attempt it interrupted is left to its lease (recovery takes it, as after a
        crash). See docs/pass.md "What code raises".
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    for leaf in leaves(exc):
        if isinstance(leaf, TimeoutException):
            return True
        if (
            isinstance(leaf, KeyboardInterrupt)
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            return True
    return False


class WaitTimeout(DurableAgentError, TimeoutError):
    """The submission did not settle within the timeout of durable_agent.wait(); it is still
    queued or running: wait again, or read its state later."""

    code = "wait_timeout"
