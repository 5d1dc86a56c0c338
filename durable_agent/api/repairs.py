"""Repair endpoints: rearm, run a pass, unpark a lane, retry a binding wait or a fault.

Each calls the same audited service as the admin
(``durable_agent.maintenance.operators.repairs`` and ``alarm.rearm``), so each writes exactly
one ``AlarmAudit`` row naming the caller: the user, or ``token:<name>``. All of them need the
repair scope (:func:`require_repair`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest
from ninja import Body, Path, Router

from durable_agent.api.auth import require_repair
from durable_agent.api.converters import THREAD
from durable_agent.api.errors import ApiError
from durable_agent.api.errors import declared as errors
from durable_agent.api.schemas import (
    HostKey,
    LaneId,
    PassReportOut,
    RearmIn,
    RearmOut,
    RepairIn,
    RepairOut,
    RowId,
    ThreadKey,
)
from durable_agent.api.selectors import get_host
from durable_agent.errors import DurableAgentError
from durable_agent.maintenance import alarm, repairs
from durable_agent.maintenance.operators.repairs import RepairResult
from durable_agent.maintenance.passes import PassReport
from durable_agent.text import validate_reason

router = Router(tags=["repairs"])
REPAIR_ERRORS = errors(400, 401, 403, 404, 409, 422)


def _repair(
    request: HttpRequest,
    key: str,
    body: RepairIn | None,
    service: Callable[..., RepairResult],
    **target: Any,
) -> RepairOut:
    """Scope, reason, host (401/403, then 422, then 404), then the audited ``service``."""
    caller = require_repair(request)
    reason = body_reason(body)
    host = get_host(key)
    result = service(host=host, actor=caller.actor, reason=reason, **target)
    return RepairOut(
        host=result.host, action=result.action, audit_id=result.audit_id, alarm=result.alarm
    )


def body_reason(body: RepairIn | None) -> str:
    """The reason of an optional body: absent, JSON ``null`` (the same as absent: the document
    declares these bodies nullable) or a JSON object."""
    return validate_reason(body.reason if body is not None else "")


@router.post(
    "hosts/{key}/rearm",
    response={200: RearmOut, **REPAIR_ERRORS},
    summary="Rearm the host's alarm",
    operation_id="rearm_host",
)
def rearm(request: HttpRequest, key: Path[HostKey], body: RearmIn) -> RearmOut:
    """Recompute the slot from the lanes and state, or set ``at``; audited.

    ``at`` later than work already due is refused (409 ``rearm_refused``): the slot must
    always hold the earliest deadline.
    """
    caller = require_repair(request)
    reason = validate_reason(body.reason, required=True)
    host = get_host(key)
    when = alarm.rearm(host, at=body.at, actor=caller.actor, reason=reason)
    return RearmOut(host=host.key, alarm=when)


@router.post(
    "hosts/{key}/pass",
    response={200: PassReportOut, **errors(400, 401, 403, 404, 409, 422, 500)},
    summary="Run a maintenance pass now",
    operation_id="run_pass",
)
def run_pass(
    request: HttpRequest, key: Path[HostKey], body: Body[RepairIn | None] = None
) -> PassReportOut:
    """Audit, then run one pass of the host in this request; returns its report.

    ``phase`` is ``busy`` when another pass holds the host (nothing changed). A pass that
    fails has already re-armed the host with a backoff; the answer is 500 ``pass_failed``.
    """
    caller = require_repair(request)
    reason = body_reason(body)
    host = get_host(key)
    try:
        report: PassReport = repairs.pass_now(host=host, actor=caller.actor, reason=reason)
    except DurableAgentError:
        raise
    except Exception as exc:
        raise ApiError(
            500,
            "pass_failed",
            f"The pass failed ({type(exc).__name__}); the host was re-armed with a backoff",
        ) from exc
    return PassReportOut.model_validate(report.as_dict())


@router.post(
    "hosts/{key}/lanes/{lane}/unpark",
    response={200: RepairOut, **REPAIR_ERRORS},
    summary="Unpark a lane",
    operation_id="unpark_lane",
)
def unpark(
    request: HttpRequest,
    key: Path[HostKey],
    lane: Path[LaneId],
    body: Body[RepairIn | None] = None,
) -> RepairOut:
    """Give a parked lane a fresh budget, due now; 409 ``not_repairable`` if not parked."""
    return _repair(request, key, body, repairs.lane_unpark, lane=lane)


@router.post(
    "hosts/{key}/binding-retries/{retry_id}/retry",
    response={200: RepairOut, **REPAIR_ERRORS},
    summary="Retry a binding wait",
    operation_id="retry_binding",
)
def retry_binding(
    request: HttpRequest,
    key: Path[HostKey],
    retry_id: Path[RowId],
    body: Body[RepairIn | None] = None,
) -> RepairOut:
    """Release a head parked for a missing binding for one more attempt."""
    return _repair(request, key, body, repairs.binding_retry_now, retry_id=retry_id)


@router.post(
    f"hosts/{{key}}/faults/{{{THREAD}:thread}}/retry",
    response={200: RepairOut, **REPAIR_ERRORS},
    summary="Retry a recovery fault now",
    operation_id="retry_fault",
)
def retry_fault(
    request: HttpRequest,
    key: Path[HostKey],
    thread: Path[ThreadKey],
    body: Body[RepairIn | None] = None,
) -> RepairOut:
    """Retry a thread's failed recovery now instead of at its scheduled time."""
    return _repair(request, key, body, repairs.fault_retry_now, thread=thread)
