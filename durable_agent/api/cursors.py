"""Opaque keyset cursors: ``<prefix>`` + the last row's id, base64url without padding.

A list endpoint orders its rows by id and hands out the last id of a page as ``next``; the
client passes it back as ``cursor``. Anything that is not such a token, of this prefix, is
422 ``invalid_cursor``.
"""

from __future__ import annotations

import base64

from durable_agent.api.errors import ApiError
from durable_agent.api.schemas import MAX_ID


def encode(prefix: str, last_id: int) -> str:
    """The ``next`` token after the row ``last_id``."""
    return prefix + base64.urlsafe_b64encode(str(last_id).encode()).decode().rstrip("=")


def decode(prefix: str, cursor: str) -> int:
    """The id a ``cursor`` continues from; 422 ``invalid_cursor`` when it is not one."""
    if cursor.startswith(prefix):
        body = cursor[len(prefix) :]
        try:
            text = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("ascii")
        except (ValueError, UnicodeDecodeError):
            text = ""
        if text.isascii() and text.isdigit() and 0 < int(text) <= MAX_ID:
            return int(text)
    raise ApiError(
        422,
        "invalid_cursor",
        "The cursor is not a `next` token of this endpoint",
        detail={"cursor": cursor},
    )
