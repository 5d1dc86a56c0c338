"""Process-wide registrations the maintenance core consults.

The publication service: upstream keeps a publication barrier (the ``agent:publication`` lane
enrolled with every native mutation) unless the installed publication service is the library's
empty default. Ours is empty until a project installs one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_publication: Callable[..., Any] | None = None


def install_publication(service: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """Install (or with None remove) the publication service; return the previous one."""
    global _publication
    previous, _publication = _publication, service
    return previous


def requires_publication() -> bool:
    """True when a publication service other than the empty default is installed."""
    return _publication is not None
