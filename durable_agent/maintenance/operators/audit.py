"""The invariant audit: does every host with owed work hold an alarm early enough?

The invariant: a dirty generation (``dirty > processed``) or any lane with a deadline needs an
armed slot no later than ``max(earliest lane deadline, now) + minimum delay`` (while a pass
holds a live lease, no later than the lease's expiry instead). Stable waits (acknowledged work
with no lane deadline) need no alarm. The audit also reports overdue slots (the scheduler is
not firing), failing hosts (the last ``FAILING_AFTER_PASSES`` passes failed), parked lanes,
expired mutation tickets, stale pass leases, and binding retries recorded under a binding
registry the runtime no longer has. The states are those of the shared read model
(:mod:`durable_agent.maintenance.store.selectors`).

Size: one audit, judged by one function (:func:`_judge`) for a host, for every host and for
the counted health audit; split, the three ways of reading would drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, NamedTuple

from django.db.models import Count, Exists, F, Min, OuterRef, Q, QuerySet, Subquery, Value

from durable_agent import clock, conf
from durable_agent.maintenance.operators.attention import Attention, attention
from durable_agent.maintenance.passes.ensure import ensure_alarm
from durable_agent.maintenance.store import selectors
from durable_agent.maintenance.store.alarm import rearm
from durable_agent.maintenance.store.rows import queued_after, queued_delivery, slot_deadline
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

__all__ = [
    "OVERDUE_AFTER",
    "AuditCounts",
    "AuditSummary",
    "HostAudit",
    "audit_all",
    "audit_host",
    "repair_host",
]

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
class AuditCounts:
    """How long each list of an :class:`AuditSummary` is (hosts; ``parked_lanes``: lanes)."""

    LISTS: ClassVar[tuple[str, ...]] = (
        "violating",
        "failing",
        "overdue",
        "parked_hosts",
        "stale_leases",
    )

    violating: int = 0
    failing: int = 0
    overdue: int = 0
    parked_hosts: int = 0
    parked_lanes: int = 0
    stale_leases: int = 0


@dataclass(frozen=True)
class AuditSummary:
    """The audit of every host. With ``listed`` (``audit_all(listed=n)``) each list holds its
    first ``n`` hosts by id and ``totals`` their full lengths; ``counts`` holds them either way."""

    hosts: int
    violating: tuple[HostAudit, ...] = ()
    overdue: tuple[str, ...] = ()
    parked: dict[str, tuple[str, ...]] = field(default_factory=dict)
    expired_tickets: int = 0
    stale_leases: tuple[str, ...] = ()
    failing: tuple[HostAudit, ...] = ()
    attention: Attention = field(default_factory=Attention)
    listed: int | None = None
    totals: AuditCounts | None = None

    @property
    def counts(self) -> AuditCounts:
        """The full length of each list (the lists may be cut to ``listed``)."""
        if self.totals is not None:
            return self.totals
        return AuditCounts(
            violating=len(self.violating),
            failing=len(self.failing),
            overdue=len(self.overdue),
            parked_hosts=len(self.parked),
            parked_lanes=sum(len(lanes) for lanes in self.parked.values()),
            stale_leases=len(self.stale_leases),
        )

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
    deadlines = [lane.due_at for lane in lanes if lane.due_at is not None]
    if stale_bindings is None:
        stale_bindings = 0
        if registry_key is not None:
            stale_bindings = (
                BindingRetry.objects.filter(host_id=host.pk)
                .exclude(registry_key=registry_key)
                .count()
            )
    if expired is None:
        expired = MutationTicket.objects.filter(host_id=host.pk, expires_at__lte=now).count()
    if failed_passes is None or last_error is None:
        streak = Host.objects.filter(pk=host.pk).annotate(
            n=selectors.failure_streak(),
            error=selectors.last_pass_error(),
        )
        failed_passes, last_error = streak.values_list("n", "error").get()
    return _judge(
        host.key,
        now=now,
        slot=slot_deadline(host.alarm) or queued_delivery(host.alarm, now),
        state=_State(
            state.dirty, state.processed, state.pass_lease_expires_at, state.pass_lease_owner
        )
        if state
        else None,
        earliest=min(deadlines) if deadlines else None,
        parked_lanes=tuple(sorted(lane.lane for lane in lanes if lane.state == "parked")),
        stale_bindings=stale_bindings,
        expired=expired,
        failed_passes=failed_passes,
        last_error=last_error,
    )


class _State(NamedTuple):
    """The figures of a host's state row the audit judges."""

    dirty: int
    processed: int
    lease_expires_at: datetime | None
    lease_owner: str | None


def _judge(
    key: str,
    *,
    now: datetime,
    slot: datetime | None,
    state: _State | None,
    earliest: datetime | None,
    parked_lanes: tuple[str, ...],
    stale_bindings: int,
    expired: int,
    failed_passes: int,
    last_error: str | None,
    delay: timedelta | None = None,
    threshold: int | None = None,
) -> HostAudit:
    """The audit of one host from its figures (no query): :func:`audit_host`'s verdict.
    ``delay`` and ``threshold`` are the settings (read when not given)."""
    dirty, processed = (state.dirty, state.processed) if state else (1, 0)
    violations: list[str] = []
    owes = state is not None and (dirty > processed or earliest is not None)
    lease_live = (
        state is not None and state.lease_expires_at is not None and state.lease_expires_at > now
    )
    if owes:
        required = max(earliest or now, now) + (delay or conf.minimum_alarm_delay())
        if lease_live and state is not None and state.lease_expires_at is not None:
            required = max(required, state.lease_expires_at)
        if slot is None:
            violations.append("owed work without an armed alarm")
        elif slot > required:
            violations.append(
                f"alarm at {slot.isoformat()} is later than the work due by {required.isoformat()}"
            )
    if stale_bindings:
        violations.append(
            f"{stale_bindings} binding retries wait for a registry that has since changed"
        )
    if threshold is None:
        threshold = selectors.failing_after()
    return HostAudit(
        host=key,
        dirty=dirty,
        processed=processed,
        slot=slot,
        earliest_due=earliest,
        violations=tuple(violations),
        overdue=selectors.is_overdue(slot, now),
        parked_lanes=parked_lanes,
        expired_tickets=expired,
        stale_lease=bool(
            state
            and state.lease_owner
            and state.lease_expires_at is not None
            and state.lease_expires_at <= now
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


def _candidate_ids(now: datetime, registry_key: str | None) -> QuerySet[Any]:
    """The ``UNION`` of the ids of every host :func:`_may_be_unhealthy` can keep, and maybe a
    few more (Note [The audit reads its candidates first])."""
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
    return first.union(*rest)


def _candidates(now: datetime, registry_key: str | None) -> list[int]:
    """The ids, ascending, of every host :func:`_may_be_unhealthy` can keep, and maybe a few
    more (Note [The audit reads its candidates first])."""
    return sorted({row[0] for row in _candidate_ids(now, registry_key)})


def audit_all(
    *, now: datetime | None = None, registry_key: str | None = None, listed: int | None = None
) -> AuditSummary:
    """Audit every host: one count, one query for the hosts that may be unhealthy, then three
    queries per page of :data:`PAGE_SIZE` of them (hosts with their per-host counts, their
    state rows, their lanes), whatever the number of hosts. Healthy hosts are counted, not
    read. With ``listed``, each list holds only its first ``listed`` hosts by id (``counts``
    the full lengths), in a number of queries that does not grow with the hosts while
    ``5 * listed`` stays under :data:`PAGE_SIZE` (Note [Counting the unhealthy hosts]).

    Note [The audit reads its candidates first]
        Every condition of :func:`_may_be_unhealthy` needs a row that an index finds without
        reading every host: a dirty state row (``da_state_dirty``), a lane with a deadline and
        a slot that is disarmed or later than it (``da_duelane_due_at``), an overdue slot
        (``da_schedule_armed_next_run``), a parked lane (``da_duelane_parked``), an expired
        ticket, a lease, a failed pass (``da_pass_failed``), a stale binding retry. Their
        hosts' ids are read first, in one ``UNION``; the filter and the per-host figures are
        then computed for those hosts alone, :data:`PAGE_SIZE` ids at a time. Evaluated on
        every host instead, the filter read a million hosts one by one (about 20 s).

    Note [Counting the unhealthy hosts]
        ``GET health`` shows the first hosts of each list and the lists' lengths. Reading
        every unhealthy host in full for that (a model instance, its lanes, its last error of
        up to thousands of characters, subqueries per host) took about 3 s at 20 000
        unhealthy hosts. With ``listed`` the audit reads the candidates' figures in a few
        grouped queries (the ``UNION`` above as a subquery, so no id list travels; the
        failure streak as an anti-join), applies :func:`_may_be_unhealthy` to them in Python
        and judges each with the same :func:`_judge` as :func:`audit_host`; then only the
        hosts shown, at most ``5 * listed``, are audited in full (docs/benchmarks.md, "The
        health audit and the number of hosts").
    """
    now = now or clock.now()
    hosts = Host.objects.count()
    if listed is not None:
        return _audit_listed(hosts, now, registry_key, listed)
    results = [
        audit for _pk, audit in _audit_pages(_candidates(now, registry_key), now, registry_key)
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


def _unhealthy(now: datetime, registry_key: str | None) -> QuerySet[Host]:
    """The hosts :func:`_may_be_unhealthy` keeps, with the per-host counts the audit needs."""
    stale = (
        selectors.count_per_host(BindingRetry.objects.exclude(registry_key=registry_key))
        if registry_key is not None
        else Value(0)
    )
    deadlines = DueLane.objects.filter(host=OuterRef("pk"), due_at__isnull=False)
    not_busy = PassRecord.objects.filter(host=OuterRef("pk")).exclude(phase=PassPhase.BUSY)
    return (
        Host.objects.annotate(
            earliest_due_at=Subquery(deadlines.order_by("due_at").values("due_at")[:1]),
            last_phase=Subquery(not_busy.order_by("-started_at", "-id").values("phase")[:1]),
        )
        .filter(_may_be_unhealthy(now, registry_key))
        .annotate(
            n_stale=stale,
            n_expired=selectors.count_per_host(MutationTicket.objects.filter(expires_at__lte=now)),
            n_failed=selectors.failure_streak(),
        )
    )


def _audit_pages(
    candidates: list[int], now: datetime, registry_key: str | None
) -> list[tuple[int, HostAudit]]:
    """The audits of the ``candidates`` :func:`_may_be_unhealthy` keeps, by id: three queries
    per :data:`PAGE_SIZE` of them."""
    annotated = (
        _unhealthy(now, registry_key)
        .select_related("alarm")
        .annotate(error=selectors.last_pass_error())
    )
    results: list[tuple[int, HostAudit]] = []
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
            (
                h.pk,
                audit_host(
                    h,
                    now=now,
                    state=states.get(h.pk),
                    lanes=lanes.get(h.pk, []),
                    registry_key=registry_key,
                    stale_bindings=h.n_stale,  # type: ignore[attr-defined]
                    expired=h.n_expired,  # type: ignore[attr-defined]
                    failed_passes=h.n_failed,  # type: ignore[attr-defined]
                    last_error=h.error or "",
                ),
            )
            for h in page
        ]
    return results


def _figures(now: datetime, registry_key: str | None) -> list[tuple[Any, ...]]:
    """One row of figures per candidate host, by id: ``(pk, key, alarm_id, repeats, next_run,
    task, state, dirty, processed, lease_at, owner, earliest, last_phase, n_stale, n_expired,
    n_failed, n_parked)`` (``last_phase``: ``failed`` or None), the figures :func:`_unhealthy`
    annotates, read as a few
    grouped queries over the candidates' rows instead of subqueries per host (Note [Counting
    the unhealthy hosts])."""
    candidates = _candidate_ids(now, registry_key)
    earliest = dict(
        DueLane.objects.filter(host_id__in=candidates, due_at__isnull=False)
        .values("host_id")
        .annotate(earliest=Min("due_at"))
        .values_list("host_id", "earliest")
        .order_by()
    )

    def per_host(rows: QuerySet[Any]) -> dict[int, int]:
        """Rows per host; every host with such a row is a candidate (it is one of the arms)."""
        counted = rows.values("host_id").annotate(n=Count("pk"))
        return dict(counted.values_list("host_id", "n").order_by())

    parked = per_host(DueLane.objects.parked())
    stale = (
        per_host(BindingRetry.objects.exclude(registry_key=registry_key))
        if registry_key is not None
        else {}
    )
    expired = per_host(MutationTicket.objects.filter(expires_at__lte=now))
    # selectors.failure_streak: the failed passes that no successful pass started at or after
    # (an anti-join, where "after the latest success" is a subquery per failed pass)
    later_ok = PassRecord.objects.filter(
        host=OuterRef("host_id"),
        phase__in=selectors.SUCCEEDED,
        started_at__gte=OuterRef("started_at"),
    )
    streaks = per_host(PassRecord.objects.filter(phase=PassPhase.FAILED).exclude(Exists(later_ok)))
    # the hosts whose latest pass that is not busy failed (_may_be_unhealthy's last_phase)
    not_busy = PassRecord.objects.filter(host=OuterRef("pk")).exclude(phase=PassPhase.BUSY)
    failed_last = set(
        Host.objects.filter(  # all candidates: a failed pass is one of the candidates' arms
            pk__in=PassRecord.objects.filter(phase=PassPhase.FAILED).values("host_id")
        )
        .annotate(last_phase=Subquery(not_busy.order_by("-started_at", "-id").values("phase")[:1]))
        .filter(last_phase=PassPhase.FAILED)
        .values_list("pk", flat=True)
    )
    rows = []
    for row in (
        Host.objects.filter(pk__in=candidates)
        .order_by("pk")
        .values_list(
            "pk",
            "key",
            "alarm_id",
            "alarm__repeats",
            "alarm__next_run",
            "alarm__task",
            "maintenance__pk",
            "maintenance__dirty",
            "maintenance__processed",
            "maintenance__pass_lease_expires_at",
            "maintenance__pass_lease_owner",
        )
    ):
        host = row[0]
        rows.append(
            (
                *row,
                earliest.get(host),
                PassPhase.FAILED if host in failed_last else None,
                stale.get(host, 0),
                expired.get(host, 0),
                streaks.get(host, 0),
                parked.get(host, 0),
            )
        )
    return rows


def _audit_listed(hosts: int, now: datetime, registry_key: str | None, listed: int) -> AuditSummary:
    """:func:`audit_all` with ``listed``: judge every candidate from its figures (no model
    instance, no lane, no error text), count in :class:`AuditCounts`, and audit in full only
    the first ``listed`` hosts of each list (Note [Counting the unhealthy hosts])."""
    rows = _figures(now, registry_key)
    delay, threshold = conf.minimum_alarm_delay(), selectors.failing_after()
    lists: dict[str, list[int]] = {name: [] for name in AuditCounts.LISTS}
    parked_lanes = expired = 0
    queued_from = queued_after(now)
    for (pk, key, alarm, repeats, next_run, task, state, dirty, processed, lease_at, owner,
         earliest, last_phase, n_stale, n_expired, n_failed, n_parked) in rows:  # fmt: skip
        # _may_be_unhealthy, on the figures read (one subquery each instead of one per use); a
        # queued delivery is armed at its deadline (Note [A queued delivery holds the slot])
        armed = alarm is not None and (
            repeats != 0 or (bool(task) and next_run is not None and next_run > queued_from)
        )
        owes = state is not None and (dirty > processed or earliest is not None)
        late = not armed or (
            next_run is not None
            and next_run > now + delay
            and (earliest is None or next_run > earliest + delay)
        )
        if not (
            (owes and late)
            or (armed and next_run is not None and next_run < now - OVERDUE_AFTER)
            or n_parked
            or n_expired
            or (owner and lease_at is not None and lease_at <= now)
            or last_phase == PassPhase.FAILED
            or (registry_key is not None and n_stale)
        ):
            continue
        audit = _judge(
            key,
            now=now,
            slot=next_run if armed else None,
            state=None if state is None else _State(dirty, processed, lease_at, owner),
            earliest=earliest,
            parked_lanes=(),
            stale_bindings=n_stale,
            expired=n_expired,
            failed_passes=n_failed,
            last_error="",
            delay=delay,
            threshold=threshold,
        )
        flags = (not audit.ok, audit.failing, audit.overdue, n_parked > 0, audit.stale_lease)
        for name, flag in zip(AuditCounts.LISTS, flags, strict=True):
            if flag:
                lists[name].append(pk)
        parked_lanes += n_parked
        expired += n_expired
    shown = sorted({pk for ids in lists.values() for pk in ids[:listed]})
    audits = [audit for _pk, audit in _audit_pages(shown, now, registry_key)]

    def first(flag: Callable[[HostAudit], bool]) -> list[HostAudit]:
        return [audit for audit in audits if flag(audit)][:listed]

    counts = AuditCounts(
        **{name: len(ids) for name, ids in lists.items()}, parked_lanes=parked_lanes
    )
    return AuditSummary(
        hosts=hosts,
        violating=tuple(first(lambda r: not r.ok)),
        overdue=tuple(r.host for r in first(lambda r: r.overdue)),
        parked={r.host: r.parked_lanes for r in first(lambda r: bool(r.parked_lanes))},
        expired_tickets=expired,
        stale_leases=tuple(r.host for r in first(lambda r: r.stale_lease)),
        failing=tuple(first(lambda r: r.failing)),
        attention=attention(failing_hosts=counts.failing),
        listed=listed,
        totals=counts,
    )


def repair_host(
    host: Host, *, actor: str = "maintenance_audit", reason: str = ""
) -> datetime | None:
    """Re-arm a violating host: ensure_alarm (registry, lanes), then a recomputed, audited
    rearm; expired tickets are deleted."""
    MutationTicket.objects.filter(host_id=host.pk, expires_at__lte=clock.now()).delete()
    ensure_alarm(host)
    return rearm(host, actor=actor, reason=reason or "invariant audit repair")
