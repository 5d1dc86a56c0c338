"""Work cursors: where paged recovery of a thread resumes after a crash."""

from __future__ import annotations

from durable_agent.errors import InvalidInput
from durable_agent.models import WorkCursor
from durable_agent.models.recovery import MAX_CURSOR_LENGTH


def validate_cursor_text(cursor: object) -> str:
    """A work cursor is a non-empty string of at most 8192 characters."""
    if not isinstance(cursor, str) or not cursor:
        raise InvalidInput("A work cursor must be a non-empty string", cursor=cursor)
    if len(cursor) > MAX_CURSOR_LENGTH:
        raise InvalidInput(
            f"A work cursor has at most {MAX_CURSOR_LENGTH} characters, not {len(cursor)}",
            length=len(cursor),
        )
    return cursor


def read(host_id: int, thread: str) -> str | None:
    """The saved cursor of ``thread``, or None."""
    value: str | None = (
        WorkCursor.objects.filter(host_id=host_id, thread=thread)
        .values_list("cursor", flat=True)
        .first()
    )
    return value


def write(host_id: int, thread: str, cursor: str | None) -> None:
    """Save ``cursor`` for ``thread``; None deletes it (the sweep finished)."""
    if cursor is None:
        WorkCursor.objects.filter(host_id=host_id, thread=thread).delete()
        return
    WorkCursor.objects.update_or_create(
        host_id=host_id, thread=thread, defaults={"cursor": validate_cursor_text(cursor)}
    )
