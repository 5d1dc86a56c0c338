"""Read endpoints: hosts, one host, its lanes, its audit trail, and the invariant audit."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Path, Query, Router

from durable_agent import clock
from durable_agent.api import cursors
from durable_agent.api.errors import declared as errors
from durable_agent.api.schemas import (
    AttentionOut,
    AuditOut,
    AuditPageOut,
    BindingRetryOut,
    FailingHostOut,
    FaultOut,
    HealthCountsOut,
    HealthOut,
    HostAuditOut,
    HostDetailOut,
    HostFilterQuery,
    HostKey,
    HostPageOut,
    HostSummaryOut,
    InvariantOut,
    LaneOut,
    MaintenanceOut,
    PageQuery,
    PassRecordOut,
)
from durable_agent.api.selectors import (
    HostFilters,
    host_audit_page,
    host_detail,
    host_lanes,
    host_page,
)
from durable_agent.maintenance.operators.audit import AuditSummary, audit_all
from durable_agent.maintenance.store.selectors import verdict
from durable_agent.models import Host, MaintenanceState
from durable_agent.runtime import get_runtime

router = Router(tags=["hosts"])
HOST_CURSOR_PREFIX = "h1."


def encode_host_cursor(last_id: int) -> str:
    """The opaque ``next`` token of ``GET hosts`` after the host ``last_id``."""
    return cursors.encode(HOST_CURSOR_PREFIX, last_id)


def decode_host_cursor(cursor: str) -> int:
    """The host id a ``GET hosts`` cursor continues above; 422 ``invalid_cursor`` otherwise."""
    return cursors.decode(HOST_CURSOR_PREFIX, cursor)


def _summary(host: Any, now: Any) -> HostSummaryOut:
    seen = verdict(host, now)
    return HostSummaryOut(
        key=host.key,
        single_thread=host.single_thread,
        created_at=host.created_at,
        alarm=host.slot_at,
        overdue=seen.overdue,
        failing=seen.failing,
        failed_passes=seen.failed_passes,
        dirty=host.gen_dirty,
        processed=host.gen_processed,
        nonterminal=host.gen_nonterminal,
        parked_lanes=seen.parked_lanes,
        faults=seen.faults,
        binding_retries=seen.binding_waits,
    )


def _state(state: MaintenanceState | None) -> MaintenanceOut:
    if state is None:  # a missing row means dirty=1, processed=0
        return MaintenanceOut(
            dirty=1,
            processed=0,
            nonterminal=0,
            binding_registry_key=None,
            retry_generation=None,
            retry_not_before=None,
            retry_stalls=None,
            pass_lease_owner=None,
            pass_lease_expires_at=None,
            recovery_event_sequence=0,
            recovery_event_acknowledged=0,
        )
    return MaintenanceOut(
        dirty=state.dirty,
        processed=state.processed,
        nonterminal=state.nonterminal,
        binding_registry_key=state.binding_registry_key,
        retry_generation=state.retry_generation,
        retry_not_before=state.retry_not_before,
        retry_stalls=state.retry_stalls,
        pass_lease_owner=state.pass_lease_owner,
        pass_lease_expires_at=state.pass_lease_expires_at,
        recovery_event_sequence=state.recovery_event_sequence,
        recovery_event_acknowledged=state.recovery_event_acknowledged,
    )


@router.get(
    "hosts",
    response={200: HostPageOut, **errors(401, 403, 422)},
    summary="List hosts",
    operation_id="list_hosts",
)
def list_hosts(request: HttpRequest, query: Query[HostFilterQuery]) -> HostPageOut:
    """Hosts by id with their slot, generations and counts; each filter is optional; follow
    ``next`` for the next page.

    Note [Host pages]
        Keyset pagination on the id, ascending: a page is the ``limit`` hosts above the
        cursor's id, read with an index scan however deep the page, and no page counts the
        hosts (a count reads every row: at a million hosts it costs more than the page).
        Hosts created while a client pages appear after the pages it has read, so none is
        skipped or repeated; a host whose state changes may enter or leave a filtered
        listing. ``next`` is opaque (it encodes the last id) and null on the last page.
    """
    filters = HostFilters(
        overdue=query.overdue,
        parked=query.parked,
        faulted=query.faulted,
        dirty=query.dirty,
        failing=query.failing,
    )
    after = None if query.cursor is None else decode_host_cursor(query.cursor)
    page = host_page(filters=filters, limit=query.limit, after=after)
    now = clock.now()
    return HostPageOut(
        items=[_summary(host, now) for host in page.items],
        limit=query.limit,
        next=encode_host_cursor(page.items[-1].pk) if page.more else None,
    )


@router.get(
    "hosts/{key}",
    response={200: HostDetailOut, **errors(401, 403, 404, 422)},
    summary="One host",
    operation_id="get_host",
)
def get_host(request: HttpRequest, key: Path[HostKey]) -> HostDetailOut:
    """State, slot, lanes, binding retries, recovery faults and the last 10 passes."""
    detail = host_detail(key)
    host: Host = detail.host
    return HostDetailOut(
        key=host.key,
        single_thread=host.single_thread,
        created_at=host.created_at,
        alarm=detail.slot,
        overdue=detail.overdue,
        failing=detail.verdict.failing,
        failed_passes=detail.verdict.failed_passes,
        last_error=detail.verdict.last_error,
        state=_state(detail.state),
        invariant=InvariantOut(
            ok=detail.invariant.ok, violations=list(detail.invariant.violations)
        ),
        lanes=[LaneOut.model_validate(lane) for lane in detail.lanes],
        binding_retries=[BindingRetryOut.model_validate(row) for row in detail.binding_retries],
        faults=[FaultOut.model_validate(row) for row in detail.faults],
        recent_passes=[PassRecordOut.model_validate(row) for row in detail.recent_passes],
    )


@router.get(
    "hosts/{key}/lanes",
    response={200: list[LaneOut], **errors(401, 403, 404, 422)},
    summary="A host's lanes",
    operation_id="list_host_lanes",
)
def list_lanes(request: HttpRequest, key: Path[HostKey]) -> list[LaneOut]:
    """The host's due queue by lane id, dormant lanes included."""
    return [LaneOut.model_validate(lane) for lane in host_lanes(key)]


@router.get(
    "hosts/{key}/audit",
    response={200: AuditPageOut, **errors(401, 403, 404, 422)},
    summary="A host's audit trail",
    operation_id="list_host_audit",
)
def list_audit(request: HttpRequest, key: Path[HostKey], query: Query[PageQuery]) -> AuditPageOut:
    """Manual rearms, passes, unparks and retries on this host, newest first."""
    page = host_audit_page(key, limit=query.limit, offset=query.offset)
    return AuditPageOut(
        count=page.count,
        limit=page.limit,
        offset=page.offset,
        items=[AuditOut.model_validate(row) for row in page.items],
    )


HEALTH_LISTED = 50
"""``GET health`` lists at most this many hosts per list (the first by id) and this many
lanes per parked host; ``counts`` holds the full numbers (Note [A bounded health answer])."""
HEALTH_ERROR_CHARS = 500
"""``GET health`` cuts each error text to this many characters (ending with ``…``)."""


def _cut(text: str) -> str:
    return text if len(text) <= HEALTH_ERROR_CHARS else text[: HEALTH_ERROR_CHARS - 1] + "…"


def _bounded_health(summary: AuditSummary) -> HealthOut:
    """The answer of ``GET health`` for ``summary``.

    Note [A bounded health answer]
        Everyone polls ``GET health`` during an incident, exactly when many hosts are
        unhealthy. So its size does not grow with them: each list holds its first
        :data:`HEALTH_LISTED` hosts by id (``parked`` as many hosts and as many lanes per
        host), ``counts`` says how long each list is, and each error text is cut to
        :data:`HEALTH_ERROR_CHARS` characters. ``GET hosts`` with a filter (``failing``,
        ``overdue``, ``parked``) pages through every host of a list; ``GET hosts/{key}``
        shows a host's whole error.
    """
    n = HEALTH_LISTED
    parked = list(summary.parked.items())
    counts = summary.counts
    violating = []
    for audit in summary.violating[:n]:
        data = audit.as_dict()
        data["last_error"] = _cut(audit.last_error)
        data["parked_lanes"] = list(audit.parked_lanes)[:n]
        violating.append(HostAuditOut.model_validate(data))
    return HealthOut(
        ok=summary.ok,
        hosts=summary.hosts,
        counts=HealthCountsOut(
            violating=counts.violating,
            failing=counts.failing,
            overdue=counts.overdue,
            parked_hosts=counts.parked_hosts,
            parked_lanes=counts.parked_lanes,
            stale_leases=counts.stale_leases,
        ),
        listed=n,
        violating=violating,
        failing=[
            FailingHostOut(host=h.host, failed_passes=h.failed_passes, error=_cut(h.last_error))
            for h in summary.failing[:n]
        ],
        overdue=list(summary.overdue[:n]),
        parked={host: list(lanes)[:n] for host, lanes in parked[:n]},
        expired_tickets=summary.expired_tickets,
        stale_leases=list(summary.stale_leases[:n]),
        degraded=summary.degraded,
        attention=AttentionOut.model_validate(summary.attention.as_dict()),
    )


@router.get(
    "health",
    response={200: HealthOut, **errors(401, 403)},
    summary="The alarm invariant audit",
    operation_id="health",
)
def health(request: HttpRequest) -> HealthOut:
    """Counts of hosts violating the invariant, failing hosts, overdue hosts, parked lanes, and
    the first hosts of each (200 even when not ok; Note [A bounded health answer])."""
    summary = audit_all(registry_key=get_runtime().binding_registry_key(), listed=HEALTH_LISTED)
    return _bounded_health(summary)
