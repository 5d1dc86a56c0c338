"""Named failpoints at every upstream location (docs/reliability.md, the crash matrix).

``hit(name)`` is a no-op in production. Tests install a handler that raises, blocks, advances
the clock or kills the process::

    with failpoints.installed(failpoints.raise_at("maintenance:dirty:after")):
        ...
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LOCATIONS: tuple[str, ...] = (
    "maintenance:dirty:before",
    "maintenance:dirty:after",
    "maintenance:mutation:armed",
    "maintenance:mutation:finished",
    "maintenance:queue:flush",
    "maintenance:ensure:before",
    "maintenance:ensure:after",
    "maintenance:begin:before",
    "maintenance:begin:after",
    "maintenance:select:before",
    "maintenance:select:after",
    "maintenance:binding-retry:before",
    "maintenance:binding-retry:after",
    "maintenance:recovery-status:before",
    "maintenance:recovery-status:after",
    "maintenance:retry:before",
    "maintenance:retry:after",
    "maintenance:checkpoint:before",
    "maintenance:checkpoint:after",
    "maintenance:finish:before",
    "maintenance:finish:after",
    "maintenance:batch:next",
)
_KNOWN = frozenset(LOCATIONS)

Handler = Callable[[str], None]
_handler: Handler | None = None
_lock = threading.Lock()


class FailpointError(RuntimeError):
    """Raised by :func:`raise_at` handlers: a simulated crash at a failpoint."""

    def __init__(self, location: str) -> None:
        super().__init__(f"failpoint {location}")
        self.location = location


def hit(name: str) -> None:
    """Pass the failpoint ``name``; runs the installed handler, if any."""
    if name not in _KNOWN:
        raise ValueError(f"Unknown failpoint {name!r}")
    handler = _handler
    if handler is not None:
        handler(name)


@contextmanager
def installed(handler: Handler) -> Iterator[Handler]:
    """Install ``handler`` for every thread of this process until the block exits."""
    global _handler
    with _lock:
        previous, _handler = _handler, handler
    try:
        yield handler
    finally:
        with _lock:
            _handler = previous


def raise_at(location: str, *, times: int = 1) -> Handler:
    """A handler raising :class:`FailpointError` the first ``times`` times ``location`` is hit."""
    if location not in _KNOWN:
        raise ValueError(f"Unknown failpoint {location!r}")
    remaining = [times]

    def handler(name: str) -> None:
        if name == location and remaining[0] > 0:
            remaining[0] -= 1
            raise FailpointError(name)

    return handler


def recorder(into: list[str]) -> Handler:
    """A handler appending every failpoint passed to ``into``."""
    return into.append
