"""Signals durable_agent sends.

``recovery_fault``: one recovery-fault transition (created / changed / cleared), sent by the
recovery-events lane in sequence order, at least once: receivers deduplicate by
``(host.pk, event.sequence)``. Arguments: ``host`` (Host), ``event`` (RecoveryEvent). A receiver
that raises fails the delivery wave; it is retried with backoff from the same sequence.

Lifecycle signals (docs/operations.md): sent once the change they report has committed
(``transaction.on_commit``), never for a change that rolled back, at most once (a process that
dies between the commit and the send loses the signal: use them for metrics, notifications and
caches, not as a ledger). A receiver that raises is logged on the ``durable_agent.signals``
logger and does not affect the change or the other receivers. With no receiver connected,
sending costs one check.

``pass_finished`` (sender ``PassRecord``): a maintenance pass was recorded (every phase but
``stale``). Arguments: ``host`` (Host), ``report`` (PassReport), ``duration_s`` (float, by
the durable_agent clock), ``error`` (the exception of a failed pass, else None).

``lane_parked`` (sender ``DueLane``): a lane parked after attempts without progress (reported
once per parking). Arguments: ``host`` (Host), ``lane`` (the lane id).

``lane_unparked`` (sender ``DueLane``): an operator unparked a lane. Arguments: ``host``,
``lane`` (the lane id), ``audit`` (the AlarmAudit row).

``alarm_rearmed`` (sender ``Host``): an operator rearmed a host's slot. Arguments: ``host``,
``old_deadline``, ``new_deadline`` (None: disarmed), ``audit``.

``submission_settled`` (sender ``Submission``): a submission settled. Arguments:
``submission_id``, ``host_id``, ``outcome`` (``completed``, ``failed`` or ``aborted``).

``submission_needs_operator`` (sender ``Submission``): a submission started waiting for a
person: ``reason`` is ``"unknown"`` (its worker died after a side effect: resolve it),
``"approval"`` (its agent asked for approval: approve or reject it) or ``"binding"`` (its agent
version is not registered in the process that ran the pass: deploy it, or restart the
cluster). Arguments: ``host`` (Host), ``submission_id``, ``thread`` (its key), ``agent``,
``version``, ``reason``. Each is also logged at WARNING on ``durable_agent.operators``, naming
the agent@version, thread and host. Failing hosts are reported by ``pass_finished`` and
``manage.py maintenance_audit``.

``repair_performed`` (sender ``AlarmAudit``): an operator action was audited: a repair
(``rearm``, ``unpark``, ``retry-binding``, ``retry-fault``, ``pass``) or an action on a
submission (``abort``, ``approve``, ``reject``, ``resolve-unknown``). Arguments: ``host``
(Host), ``audit`` (the AlarmAudit row: ``action``, ``actor``, ``reason``, ``detail``).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger("durable_agent.signals")

recovery_fault = Signal()
pass_finished = Signal()
lane_parked = Signal()
lane_unparked = Signal()
alarm_rearmed = Signal()
submission_settled = Signal()
repair_performed = Signal()
submission_needs_operator = Signal()

_NAMES = {
    id(pass_finished): "pass_finished",
    id(lane_parked): "lane_parked",
    id(lane_unparked): "lane_unparked",
    id(alarm_rearmed): "alarm_rearmed",
    id(submission_settled): "submission_settled",
    id(repair_performed): "repair_performed",
    id(submission_needs_operator): "submission_needs_operator",
}
operators_logger = logging.getLogger("durable_agent.operators")
NEEDS_OPERATOR_HINTS = {
    "unknown": "its worker died after a side effect; resolve it (resolve_unknown) or abort it",
    "approval": "its agent asked for approval; approve or reject it",
    "binding": "its agent version is not registered where the pass ran; deploy it or restart "
    "the cluster (qcluster keeps the code it started with), or retry it from the admin",
}


def send_on_commit(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` once the current transaction commits (at once outside one).

    Receivers that raise are logged, never propagated: the change is already committed.
    """
    if not signal.has_listeners(sender):
        return
    name = _NAMES.get(id(signal), "signal")

    def send() -> None:
        for receiver, result in signal.send_robust(sender=sender, **kwargs):
            if isinstance(result, Exception):
                logger.error(
                    "A receiver of durable_agent's %s signal raised: %s",
                    name,
                    result,
                    exc_info=result,
                    extra={"action": name, "receiver": getattr(receiver, "__qualname__", "?")},
                )

    transaction.on_commit(send)


def submission_settled_on_commit(submission_id: int, host_id: int, outcome: Any) -> None:
    """``submission_settled`` for a settlement written in the current transaction."""
    from durable_agent.models import Submission  # deferred: Django - importable before apps ready

    send_on_commit(
        submission_settled,
        sender=Submission,
        submission_id=int(submission_id),
        host_id=int(host_id),
        outcome=str(outcome),
    )


def needs_operator_on_commit(
    *,
    host_id: int,
    submission_id: Any,
    thread: str,
    agent: str,
    version: str,
    reason: str,
    log: bool = True,
) -> None:
    """Once the current transaction commits: log that a submission now waits for a person
    (WARNING on ``durable_agent.operators``, naming agent@version, thread and host) and send
    ``submission_needs_operator``. ``reason`` is a key of ``NEEDS_OPERATOR_HINTS``; ``log``
    False when the caller logged it already."""
    from durable_agent.models import Host, Submission  # deferred: Django - as in the one above

    def report() -> None:
        host = Host.objects.filter(pk=host_id).first()
        key = host.key if host is not None else str(host_id)
        if log:
            operators_logger.warning(
                "Submission %s (agent %s@%s, thread %r, host %r) needs an operator: %s",
                submission_id,
                agent,
                version,
                thread,
                key,
                NEEDS_OPERATOR_HINTS.get(reason, reason),
                extra={
                    "action": "needs_operator",
                    "reason": reason,
                    "host_key": key,
                    "thread_key": thread,
                    "submission_id": str(submission_id),
                    "agent": f"{agent}@{version}",
                },
            )
        if host is None or not submission_needs_operator.has_listeners(Submission):
            return
        for receiver, result in submission_needs_operator.send_robust(
            sender=Submission,
            host=host,
            submission_id=int(submission_id),
            thread=thread,
            agent=agent,
            version=version,
            reason=reason,
        ):
            if isinstance(result, Exception):
                logger.error(
                    "A receiver of durable_agent's submission_needs_operator signal raised: %s",
                    result,
                    exc_info=result,
                    extra={
                        "action": "submission_needs_operator",
                        "receiver": getattr(receiver, "__qualname__", "?"),
                    },
                )

    transaction.on_commit(report)
