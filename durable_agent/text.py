"""Text the database can store, what "blank" means, and how a message spells a duration.

Note [Storable text]
    PostgreSQL's ``text`` and ``jsonb`` cannot hold a NUL character, and no UTF-8 encoding
    exists for a lone surrogate (``"\\ud800"``, which Python strings and JSON ``\\u`` escapes
    can carry). Either one fails the write with a raw ``DataError`` or ``UnicodeEncodeError``
    deep inside a transaction. Every service checks the strings it stores or looks up with
    :func:`check_text` first, so the caller gets an :class:`~durable_agent.errors.InvalidInput`
    (a 422 through the API) and nothing is written. Payloads and results go through
    ``durable_agent.agents.services.encode_json``, which applies the same check to every key
    and string they hold.

    Text the runtime produces itself (an agent's or a lane's error, a recovery diagnostic, a
    pass record's error, the reason of a failed alarm transaction) is not refused but made
    storable by :func:`storable`, the one rule for it: each NUL and each surrogate becomes
    U+FFFD (the replacement character) and the text is cut to the field's limit. Errors are
    read with :func:`error_text`, which never raises (Note [Describing an error] in
    ``durable_agent/errors.py``).

Note [Blank text]
    A required reason or name must not be blank: nothing is left once Unicode whitespace
    *and* format characters (category Cf: zero-width space U+200B, word joiner U+2060, BOM
    U+FEFF, bidi marks, ...) are taken out. Only whitespace is trimmed from the text kept, so
    a reason that ends in an emoji tag sequence keeps it.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from durable_agent.errors import InvalidInput, describe_error

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

#: What :func:`storable` puts in place of a character no database can store.
REPLACEMENT = "\ufffd"
#: What :func:`storable` ends a cut text with.
ELLIPSIS = "\u2026"


def storable(value: str, *, limit: int) -> str:
    """``value`` as every supported database can store it (Note [Storable text]).

    Each NUL character and each surrogate becomes :data:`REPLACEMENT`; a text longer than
    ``limit`` characters is cut to ``limit`` characters, the last one :data:`ELLIPSIS`. The
    result is a plain ``str`` (never a subclass with behaviour of its own).
    """
    text = _UNSTORABLE.sub(REPLACEMENT, str.__str__(value))
    if len(text) > limit:
        text = text[: max(limit - 1, 0)] + ELLIPSIS
    return text


def error_text(exc: BaseException, *, limit: int) -> str:
    """``"TypeName: message"`` of ``exc``, storable and at most ``limit`` characters; never
    raises (Note [Storable text])."""
    return storable(describe_error(exc), limit=limit)


def storable_json(value: Any, *, limit: int = 2000) -> Any:
    """A copy of the JSON value ``value`` whose keys and strings went through :func:`storable`
    (each string cut to ``limit``); for diagnostics that code other than ours may fill."""
    if isinstance(value, str):
        return storable(value, limit=limit)
    if isinstance(value, dict):
        return {
            storable(str(key), limit=limit): storable_json(item, limit=limit)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [storable_json(item, limit=limit) for item in value]
    return value


def unstorable(value: str) -> str | None:
    """Why the database cannot store ``value`` (a NUL character, a lone surrogate), or None."""
    found = _UNSTORABLE.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return "a NUL character"
    return f"a lone surrogate (U+{ord(found.group()):04X})"


def check_text(
    value: str, *, what: str, error: type[InvalidInput] = InvalidInput, **context: Any
) -> str:
    """Return ``value`` if the database can store it, else raise ``error`` (Note [Storable text]).

    Args:
        value: the string to check (the caller has checked it is a string).
        what: what it is, for the message ("reason", "thread key", ...).
        error: the :class:`~durable_agent.errors.InvalidInput` subclass to raise.
        **context: attributes of the error.
    """
    problem = unstorable(value)
    if problem is not None:
        raise error(f"The {what} contains {problem}, which cannot be stored", **context)
    return value


def is_blank(value: str) -> bool:
    """True when ``value`` is only whitespace and format characters (Note [Blank text])."""
    return all(char.isspace() or unicodedata.category(char) == "Cf" for char in value)


MAX_REASON_LENGTH = 2000


def validate_reason(reason: object, *, required: bool = False) -> str:
    """A repair's or rearm's reason, as the audit row keeps it (whitespace trimmed).

    Raises:
        InvalidInput: not a string, longer than ``MAX_REASON_LENGTH``, holding a NUL character
            or a lone surrogate, or blank (Note [Blank text]) when ``required``.
    """
    if not isinstance(reason, str):
        raise InvalidInput("A reason must be a string")
    check_text(reason, what="reason")
    if is_blank(reason):
        if required:
            raise InvalidInput("A reason is required for this repair")
        return ""
    reason = reason.strip()
    if len(reason) > MAX_REASON_LENGTH:
        raise InvalidInput(f"A reason has at most {MAX_REASON_LENGTH} characters")
    return reason


_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000))


def duration(ms: float | int | None) -> str:
    """A compact duration: ``"350 ms"``, ``"4.2 s"``, ``"3 min 5 s"``, ``"2 h 5 min"``."""
    if ms is None:
        return "-"
    sign = "-" if ms < 0 else ""
    value = abs(float(ms))
    if value < 1_000:
        return f"{sign}{value:.0f} ms"
    if value < 10_000:
        return f"{sign}{value / 1_000:.1f} s"
    parts: list[str] = []
    rest = int(value)
    for unit, size in _UNITS:
        count, rest = divmod(rest, size)
        if count or parts:
            parts.append(f"{count} {unit}")
        if len(parts) == 2:
            break
    parts = [part for part in parts if not part.startswith("0 ")] or parts[:1]
    return sign + " ".join(parts)
