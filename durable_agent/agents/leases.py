"""Submission leases: an attempt owns its head while its lease is live.

A claim is one conditional update (``ready`` -> ``running`` with a fresh owner and expiry), in
its own short transaction; zero rows updated means someone else claimed or settled the row,
and the caller backs off. While the agent runs, a :class:`LeaseKeeper` renews the lease every
``renew_every()`` (from a thread started at the first renewal); an attempt that dies stops
renewing, and recovery takes the submission back once ``lease_expires_at`` has passed.

The lease length and renewal cadence are the ``AGENT_LEASE_TTL_MS`` (30 s) and
``AGENT_LEASE_RENEWAL_MS`` (10 s) settings.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F

from durable_agent import clock, conf
from durable_agent.compiled import Columns, reading
from durable_agent.models import Submission, SubmissionState, Thread
from durable_agent.renewals import renewing

logger = logging.getLogger("durable_agent.agents")


def lease_ttl() -> timedelta:
    """How long a claim or a renewal keeps a submission owned."""
    return conf.agent_lease_ttl()


def renew_every() -> timedelta:
    """How often a running attempt renews its lease."""
    return conf.agent_lease_renewal()


def new_owner() -> str:
    return uuid.uuid4().hex


def claim(submission_id: int, owner: str, now: datetime) -> bool:
    """Claim a ``ready`` submission without an abort intent; False when it is not claimable.

    Resets ``side_effect_marked``: the mark belongs to one attempt. One autocommitted
    ``UPDATE`` (a single statement is atomic on its own: no ``BEGIN`` and ``COMMIT`` round
    trips around it); the caller is never inside a transaction (``process_thread_head``).
    """
    updated = Submission.objects.filter(
        pk=submission_id, state=SubmissionState.READY, abort_requested_at__isnull=True
    ).update(
        state=SubmissionState.RUNNING,
        lease_owner=owner,
        lease_expires_at=now + lease_ttl(),
        attempts=F("attempts") + 1,
        side_effect_marked=False,
        updated_at=now,
    )
    return updated == 1


_claim_heads: dict[tuple[str, str, int], str] = {}

#: The most bindings :func:`claim_head` names in its statement; a process with more reads the
#: head and decides as before (one statement more before the agent).
CLAIM_HEAD_BINDINGS = 64


def claim_head(
    host_id: int,
    thread: str,
    owner: str,
    now: datetime,
    *,
    not_after: datetime,
    bindings: Sequence[tuple[str, str]],
) -> Submission | None:
    """Find the head of ``thread`` and claim it, in one autocommitted statement, when it is
    ``ready`` without an abort intent, may start by ``not_after`` and runs one of
    ``bindings`` (agent, version); None when the head is not so, or there is none, or when
    there are more than ``CLAIM_HEAD_BINDINGS`` bindings (the statement names each).

    Note [The head is claimed by the statement that finds it]
        An attempt read its thread's head (the first nonterminal submission by sequence),
        checked it, then claimed it: two statements before the agent's first line, where
        nearly every head is ``ready``, due and runnable here. So the attempt first tries
        one ``UPDATE ... RETURNING`` whose ``WHERE`` finds the thread's first nonterminal
        submission and claims it only under every condition the checks would have applied
        (``ready``, no abort intent, ``not_before`` within the start lead, a binding this
        process has). When it claims nothing (an ``unknown`` head to skip or to wait on, a
        head that is not ready, delayed, or whose binding is missing, a claim lost to
        someone else), the attempt reads the head and decides as before, so every such case
        keeps its behaviour and its error. The statement is as atomic as the claim was: the
        head is found and claimed under the row's lock, and a head settled meanwhile is not
        claimed.
    """
    if not bindings or len(bindings) > CLAIM_HEAD_BINDINGS:
        return None
    connection = connections[router.db_for_write(Submission)]
    sql = _claim_head_sql(connection, len(bindings))

    def field(name: str) -> Any:
        return Submission._meta.get_field(name)

    params: list[Any] = [
        SubmissionState.RUNNING.value,
        owner,
        field("lease_expires_at").get_db_prep_value(now + lease_ttl(), connection),
        False,
        field("updated_at").get_db_prep_value(now, connection),
        host_id,
        thread,
        SubmissionState.SETTLED.value,
        SubmissionState.READY.value,
        field("not_before").get_db_prep_value(not_after, connection),
    ]
    for binding in bindings:
        params.extend(binding)
    with reading(connection) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    head = Columns.cached(Submission, connection).instance(row, connection)
    assert isinstance(head, Submission)
    return head


def _claim_head_sql(connection: BaseDatabaseWrapper, bindings: int) -> str:
    key = (connection.alias, connection.vendor, bindings)
    sql = _claim_heads.get(key)
    if sql is not None:
        return sql
    quote = connection.ops.quote_name
    meta: Any = Submission._meta
    thread_meta: Any = Thread._meta

    def column(name: str, model_meta: Any = meta) -> str:
        return quote(model_meta.get_field(name).column)

    table, threads = quote(meta.db_table), quote(thread_meta.db_table)
    pk, thread_pk = column(meta.pk.name), column(thread_meta.pk.name, thread_meta)
    returning = ", ".join(Columns.cached(Submission, connection).sql)  # read back by claim_head
    pairs = ", ".join(["(%s, %s)"] * bindings)
    sql = (
        f"UPDATE {table} SET {column('state')} = %s, {column('lease_owner')} = %s, "
        f"{column('lease_expires_at')} = %s, {column('attempts')} = {column('attempts')} + 1, "
        f"{column('side_effect_marked')} = %s, {column('updated_at')} = %s "
        f"WHERE {pk} = (SELECT s.{pk} FROM {table} s WHERE s.{column('thread')} = "
        f"(SELECT t.{thread_pk} FROM {threads} t WHERE t.{column('host', thread_meta)} = %s "
        f"AND t.{column('key', thread_meta)} = %s) AND s.{column('state')} <> %s "
        f"ORDER BY s.{column('sequence')} LIMIT 1) "
        f"AND {column('state')} = %s AND {column('abort_requested_at')} IS NULL "
        f"AND ({column('not_before')} IS NULL OR {column('not_before')} <= %s) "
        f"AND ({column('agent')}, {column('agent_version')}) IN (VALUES {pairs}) "
        f"RETURNING {returning}"
    )
    _claim_heads[key] = sql
    return sql


def renew(submission_id: int, owner: str) -> bool:
    """Push the lease one TTL ahead; False when the attempt no longer owns the submission."""
    now = clock.now()
    updated = Submission.objects.filter(
        pk=submission_id, state=SubmissionState.RUNNING, lease_owner=owner
    ).update(lease_expires_at=now + lease_ttl(), updated_at=now)
    return updated == 1


class LeaseKeeper:
    """Renews one attempt's lease from a daemon thread; ``lost`` is set if renewal fails."""

    def __init__(self, submission_id: int, owner: str) -> None:
        self.submission_id = submission_id
        self.owner = owner
        self.lost = threading.Event()

    def _renew(self) -> bool:
        try:
            if renew(self.submission_id, self.owner):
                return True
            logger.warning(
                "Lease of submission %s was lost while its agent ran",
                self.submission_id,
                extra={"submission_id": self.submission_id},
            )
            self.lost.set()
        except Exception:
            logger.exception(
                "Renewing the lease of submission %s failed",
                self.submission_id,
                extra={"submission_id": self.submission_id},
            )
        return False

    @contextmanager
    def running(self) -> Iterator[LeaseKeeper]:
        """Renew the lease while the block runs (a thread starts only at the first renewal:
        Note [A renewal thread starts only when it is due] in ``durable_agent/renewals.py``)."""
        name = f"da-submission-lease-{self.submission_id}"
        with renewing(name, renew_every().total_seconds(), self._renew):
            yield self
