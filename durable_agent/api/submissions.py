"""Submission endpoints over the reference runtime's ledger services.

``POST hosts/{key}/threads/{thread}/submissions`` admits work (201), or returns the original
receipt (200) when its idempotency key, from the body or the ``Idempotency-Key`` header, was
already used on the thread with the same agent and payload. Abort, approve and resolve answer
409 ``invalid_submission_state`` when the submission is not in a state they apply to.
"""

from __future__ import annotations

import contextlib
from typing import Annotated

from django.db import transaction
from django.http import HttpRequest
from ninja import Body, Header, Path, Query, Router, Status

from durable_agent.agents import services, waiting
from durable_agent.agents.errors import SubmissionNotFound
from durable_agent.api import cursors
from durable_agent.api.auth import require_repair, require_submission_reader, require_submit
from durable_agent.api.converters import THREAD
from durable_agent.api.errors import ApiError
from durable_agent.api.errors import declared as errors
from durable_agent.api.repairs import body_reason
from durable_agent.api.schemas import (
    ApproveIn,
    HostKey,
    IdempotencyKey,
    ReceiptOut,
    RepairIn,
    ResolveIn,
    RowId,
    SubmissionFilterQuery,
    SubmissionOut,
    SubmissionPageOut,
    SubmissionStatusOut,
    SubmissionSummaryOut,
    SubmissionWaitQuery,
    SubmitIn,
    ThreadKey,
)
from durable_agent.api.selectors import get_host
from durable_agent.errors import WaitTimeout
from durable_agent.models import Submission
from durable_agent.text import validate_reason

router = Router(tags=["submissions"])
IdempotencyHeader = Annotated[IdempotencyKey | None, Header(None, alias="Idempotency-Key")]


def _status_out(status: services.SubmissionStatus) -> SubmissionStatusOut:
    return SubmissionStatusOut(
        submission_id=status.submission_id,
        thread=status.thread,
        sequence=status.sequence,
        state=status.state,  # type: ignore[arg-type]
        outcome=status.outcome,  # type: ignore[arg-type]
        abort_requested=status.abort_requested,
    )


@router.post(
    f"hosts/{{key}}/threads/{{{THREAD}:thread}}/submissions",
    response={201: ReceiptOut, 200: ReceiptOut, **errors(400, 401, 403, 404, 409, 422)},
    summary="Submit work to a thread",
    operation_id="submit",
)
def submit(
    request: HttpRequest,
    key: Path[HostKey],
    thread: Path[ThreadKey],
    body: SubmitIn,
    idempotency_key: IdempotencyHeader = None,
) -> Status[ReceiptOut]:
    """Append a submission to the thread (created on first use); 201 on admit.

    Replaying an idempotency key returns the original receipt with 200; the same key with a
    different agent or payload is 409 ``idempotency_conflict``. A key in both the body and
    the header must match (400 ``idempotency_key_mismatch``).
    """
    require_submit(request)
    key_in_body = body.idempotency_key
    if key_in_body is not None and idempotency_key is not None and key_in_body != idempotency_key:
        raise ApiError(
            400,
            "idempotency_key_mismatch",
            "The Idempotency-Key header and the body's idempotency_key differ",
        )
    services.validate_payload(body.payload)  # what submit() checks, before any lookup
    host = get_host(key)
    receipt = services.submit(
        host=host,
        thread=thread,
        agent=body.agent,
        payload=body.payload,
        idempotency_key=key_in_body or idempotency_key,
        version=body.version,
        not_before=body.not_before,
    )
    out = ReceiptOut(
        submission_id=receipt.submission_id,
        thread=receipt.thread,
        sequence=receipt.sequence,
        idempotency_key=receipt.idempotency_key,
        created=receipt.created,
        state=receipt.state,  # type: ignore[arg-type]
    )
    return Status(201 if receipt.created else 200, out)


CURSOR_PREFIX = "s1."


def encode_cursor(last_id: int) -> str:
    """The opaque ``next`` token after the row ``last_id`` (Note [Submission pages])."""
    return cursors.encode(CURSOR_PREFIX, last_id)


def decode_cursor(cursor: str) -> int:
    """The id a ``cursor`` continues below; 422 ``invalid_cursor`` when it is not one."""
    return cursors.decode(CURSOR_PREFIX, cursor)


@router.get(
    "submissions",
    response={200: SubmissionPageOut, **errors(401, 403, 404, 422)},
    summary="List submissions",
    operation_id="list_submissions",
)
def list_submissions(
    request: HttpRequest, query: Query[SubmissionFilterQuery]
) -> SubmissionPageOut:
    """Submissions newest first, each filter optional; follow ``next`` for the next page.

    Note [Submission pages]
        Keyset pagination on the id, descending: a page is the ``limit`` rows below the
        cursor's id. Rows submitted while a client pages appear above its first page, so no
        row is skipped or repeated; a row that changes state may leave a filtered listing.
        ``next`` is opaque (it encodes the last id) and null on the last page. An unknown
        ``host`` is 404 ``host_not_found``.
    """
    require_submission_reader(request)
    rows = Submission.objects.select_related("host", "thread").order_by("-id")
    if query.host is not None:
        rows = rows.filter(host=get_host(query.host))
    if query.thread is not None:
        rows = rows.filter(thread__key=query.thread)
    if query.state is not None:
        rows = rows.filter(state=query.state)
    if query.agent is not None:
        rows = rows.filter(agent=query.agent)
    if query.cursor is not None:
        rows = rows.filter(id__lt=decode_cursor(query.cursor))
    page = list(rows[: query.limit + 1])
    more = len(page) > query.limit
    page = page[: query.limit]
    return SubmissionPageOut(
        items=[_summary(row) for row in page],
        limit=query.limit,
        next=encode_cursor(page[-1].pk) if more else None,
    )


def _summary(row: Submission) -> SubmissionSummaryOut:
    return SubmissionSummaryOut(
        id=row.pk,
        host=row.host.key,
        thread=row.thread.key,
        sequence=row.sequence,
        agent=row.agent,
        agent_version=row.agent_version,
        idempotency_key=row.idempotency_key,
        state=row.state,  # type: ignore[arg-type]
        outcome=row.outcome,  # type: ignore[arg-type]
        attempts=row.attempts,
        not_before=row.not_before,
        abort_requested_at=row.abort_requested_at,
        approval_reason=row.approval_reason,
        created_at=row.created_at,
        updated_at=row.updated_at,
        settled_at=row.settled_at,
    )


@router.get(
    "submissions/{submission_id}",
    response={200: SubmissionOut, **errors(401, 403, 404, 422)},
    summary="One submission",
    operation_id="get_submission",
)
@transaction.non_atomic_requests  # the long poll holds no transaction (JsonPathView honours it)
def get_submission(
    request: HttpRequest, submission_id: Path[RowId], query: Query[SubmissionWaitQuery]
) -> SubmissionOut:
    """A submission's state, outcome, result and timeline; with ``wait``, a long poll that
    answers once it settles or after ``wait`` seconds (at most 30), whichever comes first.

    Under ``ATOMIC_REQUESTS`` too: the endpoint is exempt from the request's transaction on the
    default database, the one ``durable_agent.wait`` reads."""
    require_submission_reader(request)
    if query.wait:
        with contextlib.suppress(WaitTimeout):  # then answer with the current state
            waiting.wait(submission_id, timeout=query.wait)
    row = Submission.objects.select_related("host", "thread").filter(pk=submission_id).first()
    if row is None:
        raise SubmissionNotFound(f"No submission with id {submission_id}", submission=submission_id)
    return SubmissionOut(
        **_summary(row).model_dump(),
        payload=row.payload,
        result=row.result,
        error=row.error,
        approved_at=row.approved_at,
        lease_expires_at=row.lease_expires_at,
    )


@router.post(
    "submissions/{submission_id}/abort",
    response={200: SubmissionStatusOut, **errors(401, 403, 404, 409, 422)},
    summary="Abort a submission",
    operation_id="abort_submission",
)
def abort(
    request: HttpRequest, submission_id: Path[RowId], body: Body[RepairIn | None] = None
) -> SubmissionStatusOut:
    """End a submission ``aborted``: ready, suspended or ``unknown`` ones at once; a running one
    when its attempt sees the intent. Settled submissions are 409. Audited with the caller and
    the optional ``reason``."""
    caller = require_repair(request)
    reason = body_reason(body)
    return _status_out(services.abort(submission_id, actor=caller.actor, reason=reason))


@router.post(
    "submissions/{submission_id}/approve",
    response={200: SubmissionStatusOut, **errors(400, 401, 403, 404, 409, 422)},
    summary="Answer a suspended submission's approval request",
    operation_id="approve_submission",
)
def approve(
    request: HttpRequest, submission_id: Path[RowId], body: ApproveIn
) -> SubmissionStatusOut:
    """Approved: it runs again; rejected (``approved: false``): it settles ``failed``.
    Audited (``approve`` or ``reject``) with the caller and the optional ``reason``."""
    caller = require_repair(request)
    reason = validate_reason(body.reason)
    status = services.approve(
        submission_id, approved=body.approved, actor=caller.actor, reason=reason
    )
    return _status_out(status)


@router.post(
    "submissions/{submission_id}/resolve",
    response={200: SubmissionStatusOut, **errors(400, 401, 403, 404, 409, 422)},
    summary="Resolve a submission whose side effect's outcome is unknown",
    operation_id="resolve_submission",
)
def resolve(
    request: HttpRequest, submission_id: Path[RowId], body: ResolveIn
) -> SubmissionStatusOut:
    """``completed``, ``failed`` (settle) or ``retry`` (run again) an ``unknown`` submission.
    Audited (``resolve-unknown``) with the caller and the optional ``reason``."""
    caller = require_repair(request)
    reason = validate_reason(body.reason)
    status = services.resolve_unknown(
        submission_id, outcome=body.outcome, actor=caller.actor, reason=reason
    )
    return _status_out(status)
