"""Opaque keyset cursors: ``<prefix>`` + the last row's id (base64url without padding) + ``.``
+ a signature of both.

A list endpoint orders its rows by id and hands out the last id of a page as ``next``; the
client passes it back as ``cursor``.

Note [Only issued cursors]
    A cursor is signed with the project's ``SECRET_KEY`` (Django's ``Signer``, salted with the
    endpoint's prefix), so only a ``next`` this API issued, for this endpoint, is accepted; a
    hand-made one (``h1.MDAwNQ``, any id the client likes) or one of the other endpoint is 422
    ``invalid_cursor``. A hand-made cursor could reveal nothing a filter does not (every row
    is still filtered), but the promise is simpler to keep than to qualify: clients page with
    ``next`` only. Rotating ``SECRET_KEY`` (or listing the old key in
    ``SECRET_KEY_FALLBACKS`` until pages in flight are done) ends the cursors issued before.
"""

from __future__ import annotations

import base64

from django.core.signing import BadSignature, Signer

from durable_agent.api.errors import ApiError
from durable_agent.api.schemas import MAX_ID

_SALT = "durable_agent.api.cursors:"


def _signer(prefix: str) -> Signer:
    return Signer(salt=_SALT + prefix, sep=".")


def encode(prefix: str, last_id: int) -> str:
    """The ``next`` token after the row ``last_id``."""
    body = base64.urlsafe_b64encode(str(last_id).encode()).decode().rstrip("=")
    return prefix + _signer(prefix).sign(body)


def decode(prefix: str, cursor: str) -> int:
    """The id a ``cursor`` continues from; 422 ``invalid_cursor`` when this endpoint did not
    issue it (Note [Only issued cursors])."""
    if cursor.startswith(prefix):
        try:
            body = _signer(prefix).unsign(cursor[len(prefix) :])
            text = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("ascii")
        except (BadSignature, ValueError, UnicodeDecodeError):
            text = ""
        if text.isascii() and text.isdigit() and 0 < int(text) <= MAX_ID:
            return int(text)
    raise ApiError(
        422,
        "invalid_cursor",
        "The cursor is not a `next` token of this endpoint",
        detail={"cursor": cursor},
    )
