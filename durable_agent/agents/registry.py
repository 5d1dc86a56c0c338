"""The agent registry: the bindings this process can run.

Agents register in code, usually in a module that ``AppConfig.ready()`` imports::

    import durable_agent

    @durable_agent.agent("summarise", version="2", retry_safe=True)
    def summarise(ctx, payload):
        return {"summary": payload["text"][:100]}

A binding is the pair (name, version). The *registry key* is an order-insensitive digest of
every registered pair: the maintenance pass compares it with the one it saw last, and a change
(a deployment that adds a binding) retries the heads parked for a missing binding.

This module imports no models, so decorating works before the app registry is ready.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from durable_agent.agents.errors import AgentAlreadyRegistered
from durable_agent.agents.retry_policy import RetryPolicy
from durable_agent.errors import InvalidInput

if TYPE_CHECKING:
    from durable_agent.agents.context import AgentContext

__all__ = [
    "AgentFunction",
    "AgentSpec",
    "agent",
    "lookup",
    "register",
    "registered",
    "registry_key",
    "restore",
    "snapshot",
    "unregister",
    "versions",
]

AgentFunction = Callable[["AgentContext", Any], Any]
# The lengths of Submission.agent / agent_version (a test keeps them in step; importing the
# models here would break decorating before the app registry is ready).
MAX_AGENT_NAME_LENGTH = 100
MAX_AGENT_VERSION_LENGTH = 64
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class AgentSpec:
    """One registered binding."""

    name: str
    version: str
    fn: AgentFunction
    retry_safe: bool = False
    strict_order: bool = False
    retry: RetryPolicy | None = None

    @property
    def binding(self) -> tuple[str, str]:
        return (self.name, self.version)


_lock = threading.Lock()
_agents: dict[tuple[str, str], AgentSpec] = {}
#: :func:`registry_key` of ``_agents`` as it is, or None once a binding was added or removed.
_key: list[str | None] = [None]


def _validate_name(name: object) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_AGENT_NAME_LENGTH:
        raise InvalidInput(
            f"An agent name is a string of 1 to {MAX_AGENT_NAME_LENGTH} characters, not {name!r}",
            agent=name,
        )
    return name


def _validate_version(version: object) -> str:
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    if not isinstance(version, str) or not 1 <= len(version) <= MAX_AGENT_VERSION_LENGTH:
        raise InvalidInput(
            f"An agent version is a string of 1 to {MAX_AGENT_VERSION_LENGTH} characters, "
            f"not {version!r}",
            version=version,
        )
    return version


def _same_function(a: AgentFunction, b: AgentFunction) -> bool:
    """The same function, or the same definition imported again (a module reload)."""
    if a is b:
        return True
    return (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
        getattr(b, "__module__", None),
        getattr(b, "__qualname__", None),
    ) and getattr(a, "__qualname__", None) is not None


def register(
    name: str,
    fn: AgentFunction,
    *,
    version: str | int = "1",
    retry_safe: bool = False,
    strict_order: bool = False,
    retry: RetryPolicy | None = None,
) -> AgentSpec:
    """Register ``fn(ctx, payload) -> result`` as the binding (name, version).

    Registering the same definition again (the same function, or the same module and
    qualified name after a reload) is a no-op that keeps the newest function object.

    Raises:
        AgentAlreadyRegistered: another function, or the same one with another
            ``retry_safe`` or ``strict_order``, is registered under this name and version.
        InvalidInput: the name, version or function is invalid.
    """
    name = _validate_name(name)
    version = _validate_version(version)
    if not callable(fn):
        raise InvalidInput(f"Agent {name!r} must be callable, not {type(fn).__name__}")
    spec = AgentSpec(
        name=name,
        version=version,
        fn=fn,
        retry_safe=bool(retry_safe),
        strict_order=bool(strict_order),
        retry=_validate_retry(retry),
    )
    with _lock:
        existing = _agents.get(spec.binding)
        if existing is not None and not (
            _same_function(existing.fn, fn)
            and existing.retry_safe == spec.retry_safe
            and existing.strict_order == spec.strict_order
            and existing.retry == spec.retry
        ):
            raise AgentAlreadyRegistered(
                f"Agent {name!r} version {version!r} is already registered to "
                f"{_describe(existing.fn)} (retry_safe={existing.retry_safe}, "
                f"strict_order={existing.strict_order}); bump the version "
                "to deploy a different function",
                agent=name,
                version=version,
            )
        if existing is None:
            _key[0] = None
        _agents[spec.binding] = spec
    return spec


def agent(
    name: str,
    *,
    version: str | int = "1",
    retry_safe: bool = False,
    strict_order: bool = False,
    retry: RetryPolicy | None = None,
) -> Callable[[F], F]:
    """Decorator form of :func:`register`; returns the function unchanged.

    Args:
        name: the agent name submissions refer to.
        version: the binding version (a string; an int is converted).
        retry_safe: an attempt that crashed after ``ctx.mark_side_effect()`` may simply be
            run again (the agent's side effects are idempotent). Otherwise such a crash
            leaves the submission ``unknown`` for an operator to resolve.
        strict_order: an ``unknown`` submission of this agent holds up the later submissions
            of its thread until an operator resolves or aborts it. By default (False) the
            next submission becomes the thread's head and runs; the unknown one waits alone.
        retry: a :class:`~durable_agent.RetryPolicy`: the exceptions that run the submission
            again, how many times and how far apart (``durable_agent/agents/retries.py``).
            None (the default): a failed attempt settles ``failed``.
    """

    def decorate(fn: F) -> F:
        register(
            name,
            fn,
            version=version,
            retry_safe=retry_safe,
            strict_order=strict_order,
            retry=retry,
        )
        return fn

    return decorate


def _validate_retry(retry: object) -> RetryPolicy | None:
    if retry is None or isinstance(retry, RetryPolicy):
        return retry
    raise InvalidInput(
        f"retry is a durable_agent.RetryPolicy or None, not {type(retry).__name__}", retry=retry
    )


def unregister(name: str, version: str | int = "1") -> bool:
    """Remove a binding; False when it was not registered."""
    with _lock:
        _key[0] = None
        return _agents.pop((name, str(version)), None) is not None


def lookup(name: str, version: str) -> AgentSpec | None:
    """The binding (name, version), or None when this process does not have it."""
    with _lock:
        return _agents.get((name, version))


def versions(name: str) -> tuple[str, ...]:
    """The registered versions of ``name``, sorted."""
    with _lock:
        return tuple(sorted(v for (n, v) in _agents if n == name))


def registered() -> tuple[AgentSpec, ...]:
    """Every registered binding, sorted by (name, version)."""
    with _lock:
        return tuple(_agents[key] for key in sorted(_agents))


def registry_key() -> str:
    """An order-insensitive SHA-256 digest (64 hex characters) of the registered bindings.

    Only names and versions count: two processes with the same bindings agree on the key
    whatever their registration order, and replacing a function without bumping its version
    does not change it.

    Every pass begins by comparing it with the host's stored key, so it is computed once
    after each change of the bindings (register, unregister, restore) and kept until the next.
    """
    with _lock:
        key = _key[0]
        if key is None:
            encoded = json.dumps([list(pair) for pair in sorted(_agents)], separators=(",", ":"))
            key = _key[0] = hashlib.sha256(encoded.encode("utf-8")).hexdigest()
        return key


def snapshot() -> dict[tuple[str, str], AgentSpec]:
    """A copy of the registrations (tests restore it with :func:`restore`)."""
    with _lock:
        return dict(_agents)


def restore(saved: dict[tuple[str, str], AgentSpec]) -> None:
    """Replace every registration with ``saved`` (from :func:`snapshot`)."""
    with _lock:
        _key[0] = None
        _agents.clear()
        _agents.update(saved)


def _describe(fn: AgentFunction) -> str:
    module = getattr(fn, "__module__", "?")
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}"
