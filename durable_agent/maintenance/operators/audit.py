"""The invariant audit: does every host with owed work hold an alarm early enough?

The invariant: a dirty generation (``dirty > processed``) or any lane with a deadline needs an
armed slot no later than ``max(earliest lane deadline, now) + minimum delay`` (while a pass
holds a live lease, no later than the lease's expiry instead). Stable waits (acknowledged work
with no lane deadline) need no alarm. The audit also reports overdue slots (the scheduler is
not firing), failing hosts (the last ``FAILING_AFTER_PASSES`` passes failed), parked lanes,
expired mutation tickets, stale pass leases, and binding retries recorded under a binding
registry the runtime no longer has. The states are those of the shared read model
(:mod:`durable_agent.maintenance.store.selectors`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Exists, F, OuterRef, Q, Subquery, Value

from durable_agent import clock, conf
from durable_agent.maintenance.operators.attention import Attention, attention
from durable_agent.maintenance.passes.ensure import ensure_alarm
from durable_agent.maintenance.store import selectors
from durable_agent.maintenance.store.alarm import rearm
from durable_agent.maintenance.store.rows import slot_deadline
from durable_agent.maintenance.store.selectors import OVERDUE_AFTER
from durable_agent.models import (
    BindingRetry,
    DueLane,
    Host,
    MaintenanceState,
    MutationTicket,
    PassPhase,
    PassRecord,
)

__all__ = ["OVERDUE_AFTER", "AuditSummary", "HostAudit", "audit_all", "audit_host", "repair_host"]

#: Hosts that may be unhealthy read per page by :func:`audit_all` (three queries per page).
PAGE_SIZE = 500


@dataclass(frozen=True)
class HostAudit:
    """What the audit found on one host. ``violations`` break the invariant."""

    host: str
    dirty: int
    processed: int
    slot: datetime | None
    earliest_due: datetime | None
    violations: tuple[str, ...] = ()
    overdue: bool = False
    parked_lanes: tuple[str, ...] = ()
    expired_tickets: int = 0
    stale_lease: bool = False
    stale_binding_retries: int = 0
    failing: bool = False
    failed_passes: int = 0
    last_error: str = ""

    @property
    def ok(self) -> bool:
        """The alarm invariant holds (a failing host may still hold it)."""
        return not self.violations

    @property
    def healthy(self) -> bool:
        return self.ok and not self.failing

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("slot", "earliest_due"):
            data[key] = data[key].isoformat() if data[key] else None
        data["ok"] = self.ok
        return data


@dataclass(frozen=True)
class AuditSummary:
    hosts: int
    violating: tuple[HostAudit, ...] = ()
    overdue: tuple[str, ...] = ()
    parked: dict[str, tuple[str, ...]] = field(default_factory=dict)
    expired_tickets: int = 0
    stale_leases: tuple[str, ...] = ()
    failing: tuple[HostAudit, ...] = ()
    attention: Attention = field(default_factory=Attention)

    @property
    def ok(self) -> bool:
        """No host violates the invariant and none is failing."""
        return not self.violating and not self.failing

    @property
    def degraded(self) -> bool:
        """Work waits for a person (``attention``); the alarms may still be fine."""
        return self.attention.total > 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "hosts": self.hosts,
            "violating": [h.as_dict() for h in self.violating],
            "failing": [
                {"host": h.host, "failed_passes": h.failed_passes, "error": h.last_error}
                for h in self.failing
            ],
            "overdue": list(self.overdue),
            "parked": {k: list(v) for k, v in self.parked.items()},
            "expired_tickets": self.expired_tickets,
            "stale_leases": list(self.stale_leases),
            "degraded": self.degraded,
            "attention": self.attention.as_dict(),
        }


def audit_host(
    host: Host,
    *,
    now: datetime | None = None,
    state: MaintenanceState | None = None,
    lanes: list[DueLane] | None = None,
    registry_key: str | None = None,
    stale_bindings: int | None = None,
    expired: int | None = None,
    failed_passes: int | None = None,
    last_error: str | None = None,
) -> HostAudit:
    """Audit one host (read-only). Figures not passed in are read with one query each."""
    now = now or clock.now()
    if state is None:
        state = MaintenanceState.objects.filter(host_id=host.pk).first()
    if lanes is None:
        lanes = list(DueLane.objects.filter(host_id=host.pk))
    slot = slot_deadline(host.alarm)
    dirty, processed = (state.dirty, state.processed) if state else (1, 0)
    deadlines = [lane.due_at for lane in lanes if lane.due_at is not None]
    earliest = min(deadlines) if deadlines else None
    violations: list[str] = []
    owes = state is not None and (dirty > processed or earliest is not None)
    lease_live = (
        state is not None
        and state.pass_lease_expires_at is not None
        and state.pass_lease_expires_at > now
    )
    if owes:
        required = max(earliest or now, now) + conf.minimum_alarm_delay()
        if lease_live and state is not None and state.pass_lease_expires_at is not None:
            required = max(required, state.pass_lease_expires_at)
        if slot is None:
            violations.append("owed work without an armed alarm")
        elif slot > required:
            violations.append(
                f"alarm at {slot.isoformat()} is later than the work due by {required.isoformat()}"
            )
    if stale_bindings is None:
        stale_bindings = 0
        if registry_key is not None:
            stale_bindings = (
                BindingRetry.objects.filter(host_id=host.pk)
                .exclude(registry_key=registry_key)
                .count()
            )
    if stale_bindings:
        violations.append(
            f"{stale_bindings} binding retries wait for a registry that has since changed"
        )
    if expired is None:
        expired = MutationTicket.objects.filter(host_id=host.pk, expires_at__lte=now).count()
    if failed_passes is None or last_error is None:
        streak = Host.objects.filter(pk=host.pk).annotate(
            n=selectors.failure_streak(),
            error=selectors.last_pass_error(),
        )
        failed_passes, last_error = streak.values_list("n", "error").get()
    threshold = selectors.failing_after()
    return HostAudit(
        host=host.key,
        dirty=dirty,
        processed=processed,
        slot=slot,
        earliest_due=earliest,
        violations=tuple(violations),
        overdue=selectors.is_overdue(slot, now),
        parked_lanes=tuple(sorted(lane.lane for lane in lanes if lane.state == "parked")),
        expired_tickets=expired,
        stale_lease=bool(
            state
            and state.pass_lease_owner
            and state.pass_lease_expires_at is not None
            and state.pass_lease_expires_at <= now
        ),
        stale_binding_retries=stale_bindings,
        failing=failed_passes >= threshold,
        failed_passes=failed_passes,
        last_error=(last_error or "") if failed_passes else "",
    )


def _may_be_unhealthy(now: datetime, registry_key: str | None) -> Q:
    """Hosts that can show up in the audit, for hosts annotated with ``earliest_due_at`` and
    ``last_phase`` (a superset: :func:`audit_host` decides). Every other host is healthy and
    is only counted, which keeps a large, mostly healthy fleet cheap to audit.

    A violation needs owed work and a slot that is disarmed, or later than both ``now`` and
    the earliest deadline plus the minimum delay (the required time is at least both); a
    failing host's latest pass that is not ``busy`` failed.
    """
    delay = conf.minimum_alarm_delay()
    owes = Q(maintenance__isnull=False) & (
        Q(maintenance__dirty__gt=F("maintenance__processed")) | Q(earliest_due_at__isnull=False)
    )
    late = ~selectors.armed() | (
        Q(alarm__next_run__gt=now + delay)
        & (Q(earliest_due_at__isnull=True) | Q(alarm__next_run__gt=F("earliest_due_at") + delay))
    )
    stale_lease = (
        Q(maintenance__pass_lease_owner__isnull=False)
        & ~Q(maintenance__pass_lease_owner="")
        & Q(maintenance__pass_lease_expires_at__lte=now)
    )
    maybe = (
        (owes & late)
        | selectors.overdue(now)
        | Q(selectors.parked())
        | Q(Exists(MutationTicket.objects.filter(host=OuterRef("pk"), expires_at__lte=now)))
        | stale_lease
        | Q(last_phase=PassPhase.FAILED)
    )
    if registry_key is not None:
        stale = BindingRetry.objects.filter(host=OuterRef("pk")).exclude(registry_key=registry_key)
        maybe |= Q(Exists(stale))
    return maybe


def _candidates(now: datetime, registry_key: str | None) -> list[int]:
    """The ids, ascending, of every host :func:`_may_be_unhealthy` can keep, and maybe a few
    more (Note [The audit reads its candidates first])."""
    delay = conf.minimum_alarm_delay()
    deadlines = DueLane.objects.filter(due_at__isnull=False)
    disarmed = Q(host__alarm__isnull=True) | Q(host__alarm__repeats=0)
    # A slot later than the earliest deadline plus the delay is later than some deadline's.
    later = (
        ~Q(host__alarm__repeats=0)
        & Q(host__alarm__next_run__gt=F("due_at") + delay)
        & Q(host__alarm__next_run__gt=now + delay)
    )
    arms = [
        MaintenanceState.objects.filter(dirty__gt=F("processed")).values_list("host_id"),
        deadlines.filter(disarmed).values_list("host_id"),
        deadlines.filter(later).values_list("host_id"),
        Host.objects.filter(selectors.overdue(now)).values_list("pk"),
        DueLane.objects.parked().values_list("host_id"),
        MutationTicket.objects.filter(expires_at__lte=now).values_list("host_id"),
        MaintenanceState.objects.filter(
            pass_lease_owner__isnull=False, pass_lease_expires_at__lte=now
        ).values_list("host_id"),
        PassRecord.objects.filter(phase=PassPhase.FAILED).values_list("host_id"),
    ]
    if registry_key is not None:
        arms.append(BindingRetry.objects.exclude(registry_key=registry_key).values_list("host_id"))
    first, *rest = [arm.order_by() for arm in arms]
    return sorted({row[0] for row in first.union(*rest)})


def audit_all(*, now: datetime | None = None, registry_key: str | None = None) -> AuditSummary:
    """Audit every host: one count, one query for the hosts that may be unhealthy, then three
    queries per page of :data:`PAGE_SIZE` of them (hosts with their per-host counts, their
    state rows, their lanes), whatever the number of hosts. Healthy hosts are counted, not
    read.

    Note [The audit reads its candidates first]
        Every condition of :func:`_may_be_unhealthy` needs a row that an index finds without
        reading every host: a dirty state row (``da_state_dirty``), a lane with a deadline and
        a slot that is disarmed or later than it (``da_duelane_due_at``), an overdue slot
        (``da_schedule_armed_next_run``), a parked lane (``da_duelane_parked``), an expired
        ticket, a lease, a failed pass (``da_pass_failed``), a stale binding retry. Their
        hosts' ids are read first, in one ``UNION``; the filter and the per-host figures are
        then computed for those hosts alone, :data:`PAGE_SIZE` ids at a time. Evaluated on
        every host instead, the filter read a million hosts one by one (about 20 s).
    """
    now = now or clock.now()
    stale = (
        selectors.count_per_host(BindingRetry.objects.exclude(registry_key=registry_key))
        if registry_key is not None
        else Value(0)
    )
    deadlines = DueLane.objects.filter(host=OuterRef("pk"), due_at__isnull=False)
    not_busy = PassRecord.objects.filter(host=OuterRef("pk")).exclude(phase=PassPhase.BUSY)
    annotated = (
        Host.objects.select_related("alarm")
        .annotate(
            earliest_due_at=Subquery(deadlines.order_by("due_at").values("due_at")[:1]),
            last_phase=Subquery(not_busy.order_by("-started_at", "-id").values("phase")[:1]),
        )
        .filter(_may_be_unhealthy(now, registry_key))
        .annotate(
            n_stale=stale,
            n_expired=selectors.count_per_host(MutationTicket.objects.filter(expires_at__lte=now)),
            n_failed=selectors.failure_streak(),
            error=selectors.last_pass_error(),
        )
    )
    hosts = Host.objects.count()
    candidates = _candidates(now, registry_key)
    results: list[HostAudit] = []
    for start in range(0, len(candidates), PAGE_SIZE):
        page = list(annotated.filter(pk__in=candidates[start : start + PAGE_SIZE]).order_by("pk"))
        if not page:
            continue
        ids = [h.pk for h in page]
        states = {s.host_id: s for s in MaintenanceState.objects.filter(host_id__in=ids).order_by()}
        lanes: dict[int, list[DueLane]] = {}
        for lane in DueLane.objects.filter(host_id__in=ids).order_by():
            lanes.setdefault(lane.host_id, []).append(lane)
        results += [
            audit_host(
                h,
                now=now,
                state=states.get(h.pk),
                lanes=lanes.get(h.pk, []),
                registry_key=registry_key,
                stale_bindings=h.n_stale,  # type: ignore[attr-defined]
                expired=h.n_expired,  # type: ignore[attr-defined]
                failed_passes=h.n_failed,  # type: ignore[attr-defined]
                last_error=h.error or "",  # type: ignore[attr-defined]
            )
            for h in page
        ]
    return AuditSummary(
        hosts=hosts,
        violating=tuple(r for r in results if not r.ok),
        overdue=tuple(r.host for r in results if r.overdue),
        parked={r.host: r.parked_lanes for r in results if r.parked_lanes},
        expired_tickets=sum(r.expired_tickets for r in results),
        stale_leases=tuple(r.host for r in results if r.stale_lease),
        failing=tuple(r for r in results if r.failing),
        attention=attention(failing_hosts=sum(1 for r in results if r.failing)),
    )


def repair_host(
    host: Host, *, actor: str = "maintenance_audit", reason: str = ""
) -> datetime | None:
    """Re-arm a violating host: ensure_alarm (registry, lanes), then a recomputed, audited
    rearm; expired tickets are deleted."""
    MutationTicket.objects.filter(host_id=host.pk, expires_at__lte=clock.now()).delete()
    ensure_alarm(host)
    return rearm(host, actor=actor, reason=reason or "invariant audit repair")
