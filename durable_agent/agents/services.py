"""Ledger services: submit, abort, approve, resolve_unknown (docs/first-agent.md).

Every service that changes the ledger admits the change through ONE ``gate.transaction`` with
native source progress, so the submission rows, the host's generation and its armed alarm
commit together (the invariant). A service that raises wrote nothing.

To submit atomically with your own writes, wrap both in ``gate.transaction(host)`` (not in a
raw ``transaction.atomic``, which the gate refuses): the service's frame joins yours.

Limits:
    * ``MAX_PAYLOAD_BYTES`` (256 KiB): a payload's compact JSON encoding (UTF-8) may not be
      larger. Store big inputs elsewhere and submit a reference.
    * ``MAX_PAYLOAD_DEPTH`` (64): arrays and objects nest at most this deep.
    * thread keys: 1 to 256 characters; idempotency keys: 1 to 200 characters.
    * no key, string or payload may hold a NUL character or a lone surrogate (Note [Storable
      text] in ``durable_agent/text.py``).

Size: the agent services share one transaction skeleton; splitting them by verb is pending.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from django.db.models import Max

from durable_agent import clock, signals
from durable_agent.agents import delays, registry, transitions
from durable_agent.agents.errors import (
    AgentNotRegistered,
    IdempotencyConflict,
    InvalidIdempotencyKey,
    InvalidPayload,
    InvalidSubmissionState,
    InvalidThreadKey,
    PayloadTooLarge,
    SubmissionNotFound,
)
from durable_agent.errors import InvalidInput
from durable_agent.maintenance import gate
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.maintenance.store.alarm import _actor_name
from durable_agent.maintenance.store.transactions import resolve_host_id
from durable_agent.models import (
    AlarmAudit,
    Host,
    MaintenanceState,
    Submission,
    SubmissionOutcome,
    SubmissionState,
    Thread,
)
from durable_agent.models.ledger import MAX_IDEMPOTENCY_KEY_LENGTH, MAX_THREAD_KEY_LENGTH
from durable_agent.runtime.protocol import START_LEAD
from durable_agent.text import check_text, validate_reason

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "MAX_PAYLOAD_DEPTH",
    "Receipt",
    "SubmissionStatus",
    "abort",
    "approve",
    "resolve_unknown",
    "submit",
    "validate_payload",
]

MAX_PAYLOAD_BYTES = 256 * 1024
"""The largest payload ``submit`` accepts: its compact JSON encoding, in UTF-8 bytes."""

SubmissionRef = Submission | int | str
Resolution = Literal["completed", "failed", "retry"]
RESOLUTIONS: tuple[str, ...] = ("completed", "failed", "retry")
_NOT_RUNNING = (SubmissionState.READY, SubmissionState.SUSPENDED, SubmissionState.UNKNOWN)
"""States ``abort`` settles at once: no attempt is running them."""


@dataclass(frozen=True)
class Receipt:
    """What ``submit`` accepted. ``created`` is False for a replayed idempotency key."""

    submission_id: int
    thread: str
    sequence: int
    idempotency_key: str
    created: bool
    state: str


@dataclass(frozen=True)
class SubmissionStatus:
    """A submission's state after ``abort``, ``approve`` or ``resolve_unknown``."""

    submission_id: int
    thread: str
    sequence: int
    state: str
    outcome: str | None
    abort_requested: bool


# -- validation (before any write) ---------------------------------------------------------


MAX_PAYLOAD_DEPTH = 64
"""The deepest nesting of arrays and objects a payload or a result may have."""


def _check_json(value: Any, *, what: str, limit: int | None) -> None:
    """Walk ``value`` without recursion: every key and string storable (Note [Storable text]),
    at most ``MAX_PAYLOAD_DEPTH`` levels of arrays and objects, and, with ``limit``, no more
    nodes and characters than ``limit`` (each takes at least one byte of JSON).

    A cycle is refused as too deep; the walk ends after at most ``limit`` steps.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    size = 0
    while stack:
        item, depth = stack.pop()
        size += 1
        if isinstance(item, str):
            size += len(item)
            check_text(item, what=f"{what}'s text", error=InvalidPayload)
        elif isinstance(item, (dict, list, tuple)):
            if depth >= MAX_PAYLOAD_DEPTH:
                raise InvalidPayload(
                    f"The {what} nests arrays and objects deeper than {MAX_PAYLOAD_DEPTH} levels",
                    limit=MAX_PAYLOAD_DEPTH,
                )
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str):
                        size += len(key)
                        check_text(key, what=f"{what}'s key", error=InvalidPayload)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
        if limit is not None and size > limit:
            raise PayloadTooLarge(
                f"The {what} is larger than {limit} bytes as JSON; the limit is {limit} bytes",
                limit=limit,
            )


def encode_json(value: Any, *, what: str, limit: int | None = None) -> str:
    """The compact JSON text of ``value``; InvalidPayload when it has none or the database
    could not store it (NUL characters, lone surrogates, nesting deeper than
    ``MAX_PAYLOAD_DEPTH``), PayloadTooLarge when ``limit`` is given and its UTF-8 encoding
    is longer.
    """
    _check_json(value, what=what, limit=limit)
    try:
        encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayload(f"The {what} is not JSON-serialisable: {exc}") from exc
    if limit is not None:
        size = len(encoded.encode("utf-8"))
        if size > limit:
            raise PayloadTooLarge(
                f"The {what} is {size} bytes as JSON; the limit is {limit} bytes",
                size=size,
                limit=limit,
            )
    return encoded


def validate_payload(payload: Any) -> Any:
    """``payload`` as the agent will see it (tuples become lists, ...), or the error ``submit``
    raises for it: InvalidPayload or PayloadTooLarge. The API checks request payloads with this
    same function before it looks anything up."""
    encoded = encode_json(payload, what="payload", limit=MAX_PAYLOAD_BYTES)
    return json.loads(encoded)


def _validate_thread_key(thread: object) -> str:
    if not isinstance(thread, str) or not 1 <= len(thread) <= MAX_THREAD_KEY_LENGTH:
        shown = thread if not isinstance(thread, str) else f"{len(thread)} characters"
        raise InvalidThreadKey(
            f"A thread key is a string of 1 to {MAX_THREAD_KEY_LENGTH} characters, not {shown!r}",
            thread=thread,
        )
    return check_text(thread, what="thread key", error=InvalidThreadKey)


def _validate_idempotency_key(key: object) -> str:
    if key is None:
        return uuid.uuid4().hex
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_LENGTH:
        raise InvalidIdempotencyKey(
            f"An idempotency key is a string of 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} characters "
            "(or None)",
            idempotency_key=key,
        )
    return check_text(key, what="idempotency key", error=InvalidIdempotencyKey)


def _resolve_binding(agent: object, version: object) -> tuple[str, str]:
    if not isinstance(agent, str) or not agent:
        raise InvalidInput(f"An agent name is a non-empty string, not {agent!r}", agent=agent)
    available = registry.versions(agent)
    if version is None:
        if not available:
            raise AgentNotRegistered(
                f"No agent {agent!r} is registered in this process; register it with "
                f"@durable_agent.agent({agent!r}) in the agents.py of an installed app (found "
                "when Django starts), or in a module your AppConfig.ready() imports",
                agent=agent,
            )
        if len(available) > 1:
            raise InvalidInput(
                f"Agent {agent!r} has several registered versions ({', '.join(available)}); "
                "pass version=... to choose one",
                agent=agent,
                versions=available,
            )
        return agent, available[0]
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    if not isinstance(version, str) or registry.lookup(agent, version) is None:
        known = ", ".join(available) or "none"
        raise AgentNotRegistered(
            f"Agent {agent!r} version {version!r} is not registered in this process "
            f"(registered versions: {known})",
            agent=agent,
            version=version,
        )
    return agent, version


# -- submit --------------------------------------------------------------------------------


def submit(
    *,
    host: Host | str | int,
    thread: str,
    agent: str,
    payload: Any,
    idempotency_key: str | None = None,
    version: str | int | None = None,
    not_before: datetime | timedelta | None = None,
) -> Receipt:
    """Accept ``payload`` for ``agent`` at the end of ``thread`` (created on first use).

    One commit: the thread, the submission, the host's generation and its alarm. Replaying an
    idempotency key already used on the thread returns the original receipt
    (``created=False``) and admits nothing.

    Args:
        host: a Host, its key or its id.
        thread: the thread key (1-256 characters); submissions run FIFO per thread.
        agent: a registered agent name.
        payload: any JSON-serialisable value of at most ``MAX_PAYLOAD_BYTES``, nested at most
            ``MAX_PAYLOAD_DEPTH`` deep, without NUL characters or lone surrogates.
        idempotency_key: 1-200 characters, unique per thread; None generates one.
        version: the agent version; None means the only registered version.
        not_before: delay the start: an aware datetime, or a timedelta from now (at most
            ``delays.MAX_DELAY``); the submissions behind it on its thread wait with it.
            A replayed key keeps the original time.

    Raises:
        HostNotFound, InvalidThreadKey, AgentNotRegistered, InvalidPayload, PayloadTooLarge,
        InvalidIdempotencyKey, IdempotencyConflict, InvalidInput. Nothing is written then.
    """
    thread_key = _validate_thread_key(thread)
    name, resolved_version = _resolve_binding(agent, version)
    value = validate_payload(payload)
    key = _validate_idempotency_key(idempotency_key)
    host_id = resolve_host_id(host)
    now = clock.now()
    start_at = delays.resolve_not_before(not_before, now)
    with gate.transaction(host_id) as tx:
        thread_row = _lock_thread(host_id, thread_key, now)
        existing = Submission.objects.filter(thread=thread_row, idempotency_key=key).first()
        if existing is not None:
            _check_replay(existing, name, None if version is None else resolved_version, value)
            return _receipt(existing, thread_key, created=False)
        last = Submission.objects.filter(thread=thread_row).aggregate(last=Max("sequence"))
        row = Submission.objects.create(
            host_id=host_id,
            thread=thread_row,
            sequence=(last["last"] or 0) + 1,
            agent=name,
            agent_version=resolved_version,
            payload=value,
            idempotency_key=key,
            state=SubmissionState.READY,
            not_before=start_at,
            created_at=now,
            updated_at=now,
        )
        # A delayed submission is due when its pass should begin (Note [Start delayed work
        # at its time]): its slot is armed for then, and no prompt hint goes out now.
        tx.record_progress([NATIVE], due_at=None if start_at is None else start_at - START_LEAD)
    return _receipt(row, thread_key, created=True)


def _lock_thread(host_id: int, key: str, now: Any) -> Thread:
    """The thread row, created on first use and locked (Note [Ledger lock order])."""
    Thread.objects.get_or_create(host_id=host_id, key=key, defaults={"created_at": now})
    return Thread.objects.select_for_update(of=("self",)).get(host_id=host_id, key=key)


def _check_replay(existing: Submission, agent: str, version: str | None, payload: Any) -> None:
    if (
        existing.agent != agent
        or (version is not None and existing.agent_version != version)
        or existing.payload != payload
    ):
        raise IdempotencyConflict(
            f"Idempotency key {existing.idempotency_key!r} was already used on this thread "
            f"(submission {existing.pk}, agent {existing.agent!r} version "
            f"{existing.agent_version!r}) with a different agent, version or payload",
            submission=existing.pk,
            idempotency_key=existing.idempotency_key,
        )


def _receipt(row: Submission, thread: str, *, created: bool) -> Receipt:
    return Receipt(
        submission_id=int(row.pk),
        thread=thread,
        sequence=int(row.sequence),
        idempotency_key=row.idempotency_key,
        created=created,
        state=str(row.state),
    )


# -- operations on one submission ----------------------------------------------------------


def _submission_id(submission: SubmissionRef) -> int:
    if isinstance(submission, Submission):
        if submission.pk is None:
            raise SubmissionNotFound("The submission has not been saved")
        return int(submission.pk)
    if isinstance(submission, bool):
        raise SubmissionNotFound(f"No submission {submission!r}", submission=submission)
    if isinstance(submission, int):
        return submission
    if isinstance(submission, str) and submission.isascii() and submission.isdigit():
        return int(submission)
    raise SubmissionNotFound(
        f"A submission is a Submission or its id, not {submission!r}", submission=submission
    )


def _host_of(submission_id: int) -> int:
    host_id = Submission.objects.filter(pk=submission_id).values_list("host_id", flat=True).first()
    if host_id is None:
        raise SubmissionNotFound(f"No submission with id {submission_id}", submission=submission_id)
    return int(host_id)


def _locked(submission_id: int) -> Submission:
    """The submission row, locked (Note [Lock one table])."""
    try:
        return Submission.objects.select_for_update(of=("self",)).get(pk=submission_id)
    except Submission.DoesNotExist:
        raise SubmissionNotFound(
            f"No submission with id {submission_id}", submission=submission_id
        ) from None


def _refuse(row: Submission, operation: str, hint: str) -> InvalidSubmissionState:
    state = _state_of(row)
    return InvalidSubmissionState(
        f"Cannot {operation} submission {row.pk}: it is {state}; {hint}",
        submission=row.pk,
        state=row.state,
        operation=operation,
    )


def _write(row: Submission, fields: dict[str, Any]) -> None:
    Submission.objects.filter(pk=row.pk).update(**fields)
    for name, value in fields.items():
        setattr(row, name, value)


def _audit(
    row: Submission,
    *,
    action: str,
    actor: str,
    reason: str,
    before: str,
    now: Any,
    **extra: str,
) -> None:
    """One ``AlarmAudit`` row for an operator's action on ``row``, in the action's transaction:
    it commits with the change or not at all. ``generation`` is the host's generation the
    action was admitted at (the commit advances it when the action releases work)."""
    generation = (
        MaintenanceState.objects.filter(host_id=row.host_id).values_list("dirty", flat=True).first()
    )
    audit = AlarmAudit.objects.create(
        host_id=row.host_id,
        actor=actor,
        action=action,
        reason=reason,
        generation=generation or 0,
        detail={
            "submission": int(row.pk),
            "thread": Thread.objects.values_list("key", flat=True).get(pk=row.thread_id),
            "sequence": int(row.sequence),
            "before": before,
            "after": _state_of(row),
            **extra,
        },
        at=now,
    )
    if signals.repair_performed.has_listeners(AlarmAudit):
        host = Host.objects.get(pk=row.host_id)
        signals.send_on_commit(signals.repair_performed, sender=AlarmAudit, host=host, audit=audit)
    if row.state == SubmissionState.SETTLED:
        signals.submission_settled_on_commit(row.pk, row.host_id, row.outcome)


def _state_of(row: Submission) -> str:
    return row.state if row.outcome is None else f"{row.state}/{row.outcome}"


def _status(row: Submission) -> SubmissionStatus:
    thread = Thread.objects.values_list("key", flat=True).get(pk=row.thread_id)
    return SubmissionStatus(
        submission_id=int(row.pk),
        thread=thread,
        sequence=int(row.sequence),
        state=str(row.state),
        outcome=None if row.outcome is None else str(row.outcome),
        abort_requested=row.abort_requested_at is not None,
    )


def abort(submission: SubmissionRef, *, actor: Any = None, reason: str = "") -> SubmissionStatus:
    """Ask for a submission to end ``aborted``.

    * ``ready``, ``suspended`` or ``unknown`` (nothing is running): settles ``aborted`` at
      once, wherever it is queued; the thread moves on to its next submission. For an
      ``unknown`` one this records that the operator gives up on it: whether its side effect
      happened stays unknown (use :func:`resolve_unknown` to record what happened instead).
    * ``running``: records the abort intent; the agent's ``ctx.cancelled()`` turns True, and
      the attempt settles ``aborted`` when the agent returns or raises (if its worker dies,
      recovery settles it ``aborted`` once the lease expires).
    * Repeating an abort of a running submission changes nothing (it is audited again).

    Every accepted abort writes an ``AlarmAudit`` row (action ``abort``) naming ``actor`` (a
    user, a name, or None for ``"system"``) and ``reason``, in the same commit.

    Raises:
        InvalidSubmissionState: the submission is settled.
        SubmissionNotFound: no such submission.
    """
    reason = validate_reason(reason)
    actor_name = _actor_name(actor)
    submission_id = _submission_id(submission)
    with gate.transaction(_host_of(submission_id)) as tx:
        row = _locked(submission_id)
        if row.state == SubmissionState.SETTLED:
            raise _refuse(row, "abort", "a settled submission cannot change")
        now = clock.now()
        before = _state_of(row)
        if row.state in _NOT_RUNNING:
            fields = transitions.settled(SubmissionOutcome.ABORTED, now)
            _write(row, {**fields, "abort_requested_at": row.abort_requested_at or now})
            tx.record_progress([NATIVE])
        elif row.abort_requested_at is None:
            _write(row, {"abort_requested_at": now, "updated_at": now})
            tx.record_progress([NATIVE])
        _audit(row, action="abort", actor=actor_name, reason=reason, before=before, now=now)
    return _status(row)


def approve(
    submission: SubmissionRef, *, approved: bool = True, actor: Any = None, reason: str = ""
) -> SubmissionStatus:
    """Answer a ``suspended`` submission's approval request.

    Approved: it becomes ``ready`` and its agent runs again from the start, with
    ``ctx.approved`` True; ``ctx.suspend_for_approval(reason)`` now returns for this reason
    (and for every reason approved before).
    Rejected: it settles ``failed`` with ``error={"reason": "rejected", ...}``.

    Writes an ``AlarmAudit`` row (action ``approve`` or ``reject``) naming ``actor`` and
    ``reason``, in the same commit.

    Raises:
        InvalidSubmissionState: the submission is not ``suspended``.
        SubmissionNotFound: no such submission.
    """
    if not isinstance(approved, bool):
        raise InvalidInput(f"approved must be True or False, not {approved!r}", approved=approved)
    reason = validate_reason(reason)
    actor_name = _actor_name(actor)
    submission_id = _submission_id(submission)
    with gate.transaction(_host_of(submission_id)) as tx:
        row = _locked(submission_id)
        if row.state != SubmissionState.SUSPENDED:
            raise _refuse(row, "approve", "only a suspended submission waits for approval")
        now = clock.now()
        before = _state_of(row)
        if approved:
            approvals = [*row.approvals, row.approval_reason]
            _write(row, {**transitions.ready(now), "approved_at": now, "approvals": approvals})
        else:
            error = {"reason": "rejected", "approval_reason": row.approval_reason}
            _write(row, transitions.settled(SubmissionOutcome.FAILED, now, error=error))
        tx.record_progress([NATIVE])
        action = "approve" if approved else "reject"
        _audit(row, action=action, actor=actor_name, reason=reason, before=before, now=now)
    return _status(row)


def resolve_unknown(
    submission: SubmissionRef, *, outcome: Resolution, actor: Any = None, reason: str = ""
) -> SubmissionStatus:
    """Resolve an ``unknown`` submission once an operator knows what its side effect did.

    Args:
        submission: a Submission or its id.
        outcome: ``"completed"`` (the effect happened: settle completed, result None),
            ``"failed"`` (it did not, and should not be retried: settle failed with
            ``error={"reason": "resolved_failed"}``) or ``"retry"`` (it did not: run the
            agent again; the submission becomes ``ready``).
        actor: who resolves (a user, a name; None is ``"system"``), kept in the
            ``AlarmAudit`` row (action ``resolve-unknown``) written in the same commit.
        reason: why; kept in that row.

    Raises:
        InvalidSubmissionState: the submission is not ``unknown``.
        InvalidInput: ``outcome`` is not one of the three.
        SubmissionNotFound: no such submission.
    """
    if outcome not in RESOLUTIONS:
        raise InvalidInput(
            f"outcome must be one of {', '.join(RESOLUTIONS)}, not {outcome!r}", outcome=outcome
        )
    reason = validate_reason(reason)
    actor_name = _actor_name(actor)
    submission_id = _submission_id(submission)
    with gate.transaction(_host_of(submission_id)) as tx:
        row = _locked(submission_id)
        if row.state != SubmissionState.UNKNOWN:
            raise _refuse(row, "resolve", "only an unknown submission needs a resolution")
        now = clock.now()
        before = _state_of(row)
        if outcome == "retry":
            _write(row, transitions.ready(now))
        elif outcome == "completed":
            _write(row, transitions.settled(SubmissionOutcome.COMPLETED, now))
        else:
            error = {"reason": "resolved_failed"}
            _write(row, transitions.settled(SubmissionOutcome.FAILED, now, error=error))
        tx.record_progress([NATIVE])
        _audit(
            row,
            action="resolve-unknown",
            actor=actor_name,
            reason=reason,
            before=before,
            now=now,
            outcome=outcome,
        )
    return _status(row)
