"""One attempt: claim the head with a lease, run its agent outside every transaction, settle.

Note [Agents run as producers]
    The pass calls ``process_thread_head`` under ``gate.native_source()``: the runtime's own
    writes (claim, settlement, suspension) are maintenance work and do not advance the
    generation. Agent code is not maintenance work. An agent that submits to a thread (of
    any host) is a producer, and its submission must advance that host's generation, or a
    caught-up host would never run it. So the agent runs in a copy of the context with the
    native-source flag cleared.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from durable_agent import clock, signals
from durable_agent.agents import leases, registry, retries, transitions
from durable_agent.agents.context import (
    MAX_APPROVAL_REASON_LENGTH,
    AgentContext,
    ApprovalRequested,
)
from durable_agent.agents.errors import InvalidPayload, TransactionMisuse
from durable_agent.agents.services import encode_json
from durable_agent.errors import BindingUnavailable, is_stop, leaves
from durable_agent.maintenance import gate
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.maintenance.store.rows import run_update, update_statement
from durable_agent.maintenance.store.transactions import user_atomic_depth
from durable_agent.models import Host, Submission, SubmissionOutcome, SubmissionState, Thread
from durable_agent.observability import log_extra
from durable_agent.runtime import Settlement
from durable_agent.runtime.protocol import START_LEAD
from durable_agent.text import unstorable

logger = logging.getLogger("durable_agent.agents")


def holds_thread(state: str, agent: str, version: str) -> bool:
    """Does an ``unknown`` submission keep the later submissions of its thread waiting?

    Only when its agent is registered with ``strict_order=True``. Otherwise the outcome
    waits alone for its operator and the next submission becomes the head (Note [An unknown
    outcome waits alone]).
    """
    if state != SubmissionState.UNKNOWN:
        return False
    spec = registry.lookup(agent, version)
    return spec is not None and spec.strict_order


HEAD_PAGE = 32


def head_of(host: Host, thread: str) -> Submission | None:
    """The thread's head: its first nonterminal submission (FIFO by sequence), skipping the
    ``unknown`` ones that do not hold the thread.

    Note [An unknown outcome waits alone]
        An ``unknown`` submission waits for an operator (``resolve_unknown`` or ``abort``).
        Like upstream, it does not hold up its thread: the submission behind it becomes the
        head and runs. An agent registered with ``strict_order=True`` keeps strict FIFO: its
        unknown submission stays the head and the thread waits with it.
    """
    rows = (
        Submission.objects.nonterminal()
        .filter(host=host, thread__key=thread)
        .select_related("thread")
        .order_by("sequence")
    )
    # Pages of plain queries, not ``iterator()``: on PostgreSQL outside a transaction that is
    # a server-side cursor declared WITH HOLD, several round trips for what is nearly always
    # the first row.
    page = list(rows[:HEAD_PAGE])
    while page:
        for row in page:
            if row.state != SubmissionState.UNKNOWN or holds_thread(
                row.state, row.agent, row.agent_version
            ):
                return row
        if len(page) < HEAD_PAGE:
            break
        page = list(rows.filter(sequence__gt=page[-1].sequence)[:HEAD_PAGE])
    return None


def process_thread_head(host: Host, thread: str, yield_after: datetime) -> Settlement | None:
    """Claim, run and settle the head of ``thread``; None when nothing settled.

    None means: no head, a head that is not ``ready`` (running elsewhere, suspended,
    unknown), a ``ready`` head with an abort intent (recovery settles it), a claim lost to
    someone else, a suspension, or a settlement refused because the lease was lost.

    Raises:
        BindingUnavailable: the head's agent (name, version) is not registered here; the
            head stays ``ready`` and unclaimed.
        TransactionMisuse: called inside ``transaction.atomic`` (agent code must never run
            inside a transaction).
    """
    if user_atomic_depth() > 0:
        raise TransactionMisuse(
            "process_thread_head() runs agent code and must be called outside transaction.atomic"
        )
    owner = leases.new_owner()
    head: Submission | None
    spec: registry.AgentSpec | None
    found = _claim_head(host, thread, owner)
    if found is not None:  # Note [The head is claimed by the statement that finds it]
        head, spec = found
        if head.not_before is not None:  # Note [Start delayed work at its time]
            time.sleep(max(0.0, (head.not_before - clock.now()).total_seconds()))
    else:
        head = head_of(host, thread)
        if head is None or head.state != SubmissionState.READY or head.abort_requested_at:
            return None
        if head.not_before is not None:  # Note [Start delayed work at its time]
            early = (head.not_before - clock.now()).total_seconds()
            if early > START_LEAD.total_seconds():
                return None
            if early > 0:
                time.sleep(early)
        spec = registry.lookup(head.agent, head.agent_version)
        if spec is None:
            raise BindingUnavailable(
                f"Agent {head.agent!r} version {head.agent_version!r} (submission {head.pk} on "
                f"thread {thread!r}) is not registered in this process",
                submission=str(head.pk),
                thread=thread,
                agent=head.agent,
                version=head.agent_version,
            )
        now = clock.now()
        if not leases.claim(head.pk, owner, now):
            return None
        head.state = SubmissionState.RUNNING
        head.lease_owner = owner
        head.lease_expires_at = now + leases.lease_ttl()
        head.attempts += 1
        head.side_effect_marked = False
    keeper = leases.LeaseKeeper(head.pk, owner)
    ctx = AgentContext(head, yield_after, owner, keeper.lost)
    result: Any = None
    failure: BaseException | None = None
    approval: str | None = None
    with keeper.running():
        try:
            result = _call_agent(spec.fn, ctx, head.payload)
            encode_json(result, what="result")
        except BaseException as exc:  # Note [What an agent raises]
            if is_stop(exc):
                raise
            approval = _approval_requested(exc)
            if approval is None:
                failure = exc
                if not isinstance(exc, InvalidPayload):
                    logger.warning(
                        "Agent %r failed on submission %s",
                        head.agent,
                        head.pk,
                        exc_info=True,
                        extra=log_extra(
                            host, thread_key=thread, submission_id=head.pk, action="agent_failed"
                        ),
                    )
    if approval is not None:
        return _suspend(host, head, owner, approval)
    return _settle(host, head, owner, result=result, failure=failure)


def _claim_head(
    host: Host, thread: str, owner: str
) -> tuple[Submission, registry.AgentSpec] | None:
    """The thread's head claimed by ``owner`` with its binding, when one statement could
    find and claim it (Note [The head is claimed by the statement that finds it]); else None."""
    specs = registry.snapshot()
    now = clock.now()
    head = leases.claim_head(
        host.pk, thread, owner, now, not_after=now + START_LEAD, bindings=sorted(specs)
    )
    if head is None:
        return None
    Submission.thread.field.set_cached_value(
        head,
        Thread.from_db(head._state.db, ["id", "host_id", "key"], [head.thread_id, host.pk, thread]),
    )
    return head, specs[(head.agent, head.agent_version)]


def _approval_requested(exc: BaseException) -> str | None:
    """The reason of the approval ``exc`` asks for, or None when it is a failure.

    Note [What an agent raises]
        Whatever agent code raises ends its attempt once. ``ApprovalRequested`` (the runtime's
        control flow) suspends it, also when it arrives inside exception groups, as
        ``asyncio.TaskGroup`` and anyio raise it: a group whose leaves all ask for approval
        asks for the first one's reason (once approved, the agent runs again and asks for the
        next). An ``ApprovalRequested`` the agent made itself, with a reason that
        ``ctx.suspend_for_approval`` would have refused, is a failure. Anything else settles
        the attempt ``failed``, whatever its class: an ``Exception``, a ``SystemExit``, a
        ``KeyboardInterrupt`` raised by code, a group that mixes an approval with a failure.
        Only the process being stopped is not the agent's outcome (Note [A stop is not a
        failure] in ``durable_agent/errors.py``): it leaves the attempt to its lease and
        propagates. Whatever is settled is described by ``transitions.error_of``, which never
        raises and stores only storable text (Note [Storable text] in ``durable_agent/text.py``).
    """
    found = leaves(exc)
    if not all(isinstance(leaf, ApprovalRequested) for leaf in found):
        return None
    reason = getattr(found[0], "reason", None)
    if (
        type(reason) is not str
        or not 1 <= len(reason) <= MAX_APPROVAL_REASON_LENGTH
        or unstorable(reason) is not None
    ):
        return None
    return reason


def _call_agent(fn: registry.AgentFunction, ctx: AgentContext, payload: Any) -> Any:
    """Note [Agents run as producers]."""
    return gate.run_as_producer(fn, ctx, payload)


def _owned(submission: Submission, owner: str) -> Submission | None:
    """The submission row, locked, while ``owner`` still holds its lease (Note [Lock one table])."""
    try:
        return Submission.objects.select_for_update(of=("self",)).get(
            pk=submission.pk, state=SubmissionState.RUNNING, lease_owner=owner
        )
    except Submission.DoesNotExist:
        return None


def _lost(host: Host, submission: Submission, action: str) -> None:
    logger.warning(
        "Submission %s lost its lease before it could %s; recovery owns it now",
        submission.pk,
        action,
        extra=log_extra(host, submission_id=submission.pk, action="lease_lost"),
    )


def _settle(
    host: Host,
    submission: Submission,
    owner: str,
    *,
    result: Any,
    failure: BaseException | None,
) -> Settlement | None:
    """One commit: the settlement (if still ours), native progress and the alarm.

    Note [A completed attempt settles in one statement]
        An attempt that returned settles ``completed`` unless its lease was lost or an abort
        was asked for meanwhile; a failure may instead be retried, by its agent's policy, read
        from the locked row. So a returned attempt first tries the one conditional ``UPDATE``
        that settles it (still ``running``, still its owner's, no abort intent), which locks
        the row as ``_owned``'s ``SELECT ... FOR UPDATE`` would; only when it writes nothing
        (lost, or aborted) does the attempt read the row and settle as a failure would. On
        PostgreSQL that ``UPDATE`` and its native progress are one statement that commits by
        itself (Note [A write and its progress in one statement] in
        ``durable_agent/maintenance/mutations/gate.py``).
    """
    completed = None
    if failure is None:  # the one conditional UPDATE
        fields = transitions.settled(SubmissionOutcome.COMPLETED, clock.now(), result=result)
        where = {"id": submission.pk, "state": SubmissionState.RUNNING, "lease_owner": owner}
        completed = update_statement(Submission, fields, where, null=("abort_requested_at",))
    settled = None if completed is None else gate.update_with_progress(host, completed, [NATIVE])
    if not settled:
        with gate.transaction(host) as tx:
            if completed is None or settled is False or not run_update(completed):
                return _settle_read(host, submission, owner, tx, result=result, failure=failure)
            tx.record_progress([NATIVE])
    signals.submission_settled_on_commit(
        submission.pk, submission.host_id, SubmissionOutcome.COMPLETED
    )
    return Settlement(submission.thread.key, str(submission.pk), SubmissionOutcome.COMPLETED.value)


def _settle_read(
    host: Host,
    submission: Submission,
    owner: str,
    tx: gate.SourceTransaction,
    *,
    result: Any,
    failure: BaseException | None,
) -> Settlement | None:
    """The settlement after reading the locked row: a failure, a lost lease, an abort."""
    row = _owned(submission, owner)
    if row is None:
        _lost(host, submission, "settle")
        return None
    now = clock.now()
    error = None if failure is None else transitions.error_of(failure)
    if row.abort_requested_at is None and retries.retry(host, row, owner, failure, error, now):
        tx.record_progress([NATIVE])
        return None
    if row.abort_requested_at is not None:
        outcome = SubmissionOutcome.ABORTED
    elif failure is not None:
        outcome = SubmissionOutcome.FAILED
    else:
        outcome = SubmissionOutcome.COMPLETED
    stored = None if failure is not None else result
    fields = transitions.settled(outcome, now, result=stored, error=error)
    Submission.objects.filter(pk=row.pk, lease_owner=owner).update(**fields)
    tx.record_progress([NATIVE])
    signals.submission_settled_on_commit(row.pk, row.host_id, outcome)
    return Settlement(submission.thread.key, str(submission.pk), outcome.value)


def _suspend(host: Host, submission: Submission, owner: str, reason: str) -> Settlement | None:
    """Suspend for approval (a stable wait), or settle ``aborted`` if an abort came first."""
    with gate.transaction(host) as tx:
        row = _owned(submission, owner)
        if row is None:
            _lost(host, submission, "suspend")
            return None
        now = clock.now()
        aborted = row.abort_requested_at is not None
        if aborted:
            fields = transitions.settled(SubmissionOutcome.ABORTED, now)
        else:
            fields = transitions.suspended(reason, now)
        Submission.objects.filter(pk=row.pk, lease_owner=owner).update(**fields)
        tx.record_progress([NATIVE])
        if aborted:
            signals.submission_settled_on_commit(row.pk, row.host_id, SubmissionOutcome.ABORTED)
        else:
            signals.needs_operator_on_commit(
                host_id=row.host_id,
                submission_id=row.pk,
                thread=submission.thread.key,
                agent=row.agent,
                version=row.agent_version,
                reason="approval",
            )
    if aborted:
        return Settlement(submission.thread.key, str(submission.pk), SubmissionOutcome.ABORTED)
    return None
