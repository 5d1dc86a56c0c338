"""``durable_agent.wait``: block the caller until a submission settles (docs/first-agent.md).

The waiting caller holds no transaction and no worker: it reads the submission row in
autocommit mode between waits. On PostgreSQL it sleeps on a dedicated connection that LISTENs
on ``SETTLED_CHANNEL`` (migration 0012's trigger notifies it, at commit, with the id of every
submission that becomes settled), re-reading the row on each notification for its id and at
least every ``LISTEN_RECHECK_SECONDS`` (a lost notification costs at most that). Elsewhere, or
when that connection cannot be opened, it polls with a backoff from ``POLL_FIRST_SECONDS``
doubling to ``POLL_CAP_SECONDS``. The timeout is wall-clock time (``time.monotonic``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from durable_agent.agents.errors import SubmissionNotFound, TransactionMisuse
from durable_agent.errors import InvalidInput, WaitTimeout
from durable_agent.maintenance.store.transactions import user_atomic_depth
from durable_agent.models import Submission, SubmissionState

__all__ = ["SETTLED_CHANNEL", "wait"]

logger = logging.getLogger("durable_agent.agents")

SETTLED_CHANNEL = "durable_agent_settled"  # written into migration 0012's trigger
POLL_FIRST_SECONDS = 0.05
POLL_CAP_SECONDS = 1.0
LISTEN_RECHECK_SECONDS = 5.0


def wait(submission: Any, *, timeout: float | timedelta = 60.0) -> Submission:
    """Wait until ``submission`` settles and return its row (``state == "settled"``).

    Args:
        submission: a Receipt, a Submission, or a submission id.
        timeout: how long to wait at most, in seconds (or a timedelta); 0 checks once.

    Raises:
        WaitTimeout: it had not settled when ``timeout`` passed (it keeps running; the
            error's ``state`` is the last one read).
        SubmissionNotFound: no such submission.
        TransactionMisuse: called inside ``transaction.atomic`` on a submission that has not
            settled yet (a transaction would hide the settlement and hold its snapshot open).
        InvalidInput: a negative or non-finite timeout.
    """
    seconds = _seconds(timeout)
    submission_id = _submission_id(submission)
    row = _read(submission_id)
    if row.state == SubmissionState.SETTLED:
        return row
    if user_atomic_depth() > 0:
        raise TransactionMisuse(
            "durable_agent.wait() must be called outside transaction.atomic: the settlement "
            "commits in another transaction",
            submission=submission_id,
        )
    deadline = time.monotonic() + seconds
    with _listener() as listener:
        if listener is not None:
            row = _read(submission_id)  # listening now: a settlement from here on notifies
        delay = POLL_FIRST_SECONDS
        while row.state != SubmissionState.SETTLED:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(
                    f"Submission {submission_id} did not settle within {seconds:g} s "
                    f"(it is {row.state})",
                    submission=submission_id,
                    state=str(row.state),
                    timeout=seconds,
                )
            if listener is not None:
                _sleep_on(listener, submission_id, min(remaining, LISTEN_RECHECK_SECONDS))
            else:
                time.sleep(min(remaining, delay))
                delay = min(POLL_CAP_SECONDS, delay * 2)
            row = _read(submission_id)
    return row


def _seconds(timeout: object) -> float:
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise InvalidInput(
            f"timeout is a finite number of seconds >= 0 (or a timedelta), not {timeout!r}",
            timeout=timeout,
        )
    return float(timeout)


def _submission_id(submission: Any) -> int:
    value = getattr(submission, "submission_id", None)  # a Receipt
    if value is None and isinstance(submission, Submission):
        value = submission.pk
    if value is None:
        value = submission
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SubmissionNotFound(
            f"A submission is a Receipt, a Submission or its id, not {submission!r}",
            submission=submission,
        )
    return value


def _read(submission_id: int) -> Submission:
    row = Submission.objects.filter(pk=submission_id).first()
    if row is None:
        raise SubmissionNotFound(f"No submission with id {submission_id}", submission=submission_id)
    return row


@contextlib.contextmanager
def _listener() -> Iterator[Any]:
    """A dedicated autocommit connection LISTENing on ``SETTLED_CHANNEL``; None off PostgreSQL
    or when it cannot be opened (the caller polls then)."""
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor != "postgresql":
        yield None
        return
    import psycopg  # deferred: only on PostgreSQL

    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    try:
        conn = psycopg.connect(**params, autocommit=True)
        conn.execute(f"LISTEN {SETTLED_CHANNEL}")
    except psycopg.Error:
        logger.warning("wait() could not listen for settlements; polling", exc_info=True)
        yield None
        return
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):  # closing a broken connection: nothing to release
            conn.close()


def _sleep_on(conn: Any, submission_id: int, seconds: float) -> None:
    """Return when ``submission_id`` settles (its notification), or after ``seconds``."""
    import psycopg  # deferred: only on PostgreSQL

    expected = str(submission_id)
    end = time.monotonic() + seconds
    try:
        while (left := end - time.monotonic()) > 0:
            for notify in conn.notifies(timeout=left, stop_after=1):
                if notify.payload == expected:
                    return
    except psycopg.Error:
        logger.warning("wait() lost its listening connection; re-reading", exc_info=True)
        time.sleep(max(0.0, min(POLL_CAP_SECONDS, end - time.monotonic())))
