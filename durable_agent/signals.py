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

_NAMES = {
    id(pass_finished): "pass_finished",
    id(lane_parked): "lane_parked",
    id(lane_unparked): "lane_unparked",
    id(alarm_rearmed): "alarm_rearmed",
    id(submission_settled): "submission_settled",
    id(repair_performed): "repair_performed",
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
