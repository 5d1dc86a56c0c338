"""The read model shared by the commands, the admin, the API, the audit and the health endpoint.

One definition of each state a host can be in, usable three ways: as a ``Q``/``Exists`` filter
on a ``Host`` queryset, as annotations (:func:`annotate_hosts`, a constant number of queries per
page), and as a per-host :class:`Verdict` built from those annotations.

- **armed**: the host's django-q schedule exists with ``repeats != 0``.
- **overdue**: armed, and the slot more than :data:`OVERDUE_AFTER` in the past (the scheduler
  is not firing it).
- **failing**: the last ``FAILING_AFTER_PASSES`` recorded passes failed (busy passes are not
  counted; a ``caught-up`` or ``actionable`` pass ends the streak).
- **parked**: at least one lane in the ``parked`` state.
- **faulted**: at least one open recovery fault.
- **waiting binding**: at least one binding retry.
- **dirty**: ``dirty > processed`` (a missing state row counts as dirty).
- **owed work**: submissions not yet settled; suspended ones wait for an approval, unknown
  ones for an operator to resolve them.

Size: one read model for the admin, the API, the audit and the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import (
    Case,
    Count,
    DateTimeField,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django_q.models import Schedule

from durable_agent import clock, conf
from durable_agent.models import (
    BindingRetry,
    DueLane,
    Host,
    LaneState,
    MaintenanceState,
    PassPhase,
    PassRecord,
    RecoveryFault,
    Submission,
    SubmissionState,
)
from durable_agent.models.host import armed as armed  # the rule lives with the model

OVERDUE_AFTER = timedelta(seconds=60)
#: Overdue slots a host list reads before its page (Note [Overdue slots are read first]).
OVERDUE_READ_AHEAD = 1000
#: Pass phases that end a failure streak (a busy pass ran nothing; a stale one is not recorded).
SUCCEEDED = (PassPhase.CAUGHT_UP.value, PassPhase.ACTIONABLE.value)
_BEFORE_ANY_PASS = datetime(1970, 1, 1, tzinfo=UTC)


def failing_after() -> int:
    """``FAILING_AFTER_PASSES``: failed passes in a row that make a host failing."""
    return int(conf.get("FAILING_AFTER_PASSES"))


# -- filters (on a Host queryset) ------------------------------------------------------------

# Note [Host filters at scale]
#     The host lists filter a million hosts and show a page of them. A condition over per-host
#     figures (a join, a correlated count) is evaluated for every host until a page is found,
#     and for every host again by the admin's count. So the list filters are semi-joins on the
#     few rows that make a host match, each read from a partial index (migration 0011): the
#     armed slots due before the cutoff (``da_schedule_armed_next_run``), the dirty state rows
#     (``da_state_dirty``), the parked lanes (``da_duelane_parked``), the failed passes
#     (``da_pass_failed``; the streak is then computed for those hosts only), the
#     single-thread hosts (``da_host_single_thread``). A healthy fleet reads a handful of
#     index entries; an unhealthy one, its unhealthy hosts. Each filter is one ``IN``: an
#     ``OR`` of two would again be evaluated host by host.
#
# Note [A host without a state row has no slot]
#     A missing state row reads as dirty. Looking for such hosts among all the hosts is an
#     anti-join that reads every host (seconds at a million); but a slot is only ever set in
#     an alarm transaction, which creates the host's state row first (``lock_state`` in
#     ``durable_agent/maintenance/store/transactions.py``), and a state row is deleted only with its
#     host. So a host without a state row has no slot (``alarm`` is null), and the dirty
#     filter looks for them among the hosts without a slot alone (the ``alarm`` column's
#     unique index holds its nulls).
#
# Note [Overdue slots are read first]
#     PostgreSQL estimates "armed and due before the cutoff" as the product of "armed" and "due
#     before the cutoff"; but a disarmed slot keeps the time it last held, in the past, so the
#     estimate is that of a fleet mostly overdue, and the planner walks the hosts by key,
#     looking for a page of overdue hosts among all of them. So a host list reads the overdue
#     slots first (up to ``OVERDUE_READ_AHEAD``, from ``da_schedule_armed_next_run``) and
#     filters the hosts by those ids, which the planner counts exactly. Beyond that many
#     overdue slots it filters by the semi-join: the walk by key then finds a page quickly.


def overdue(now: datetime) -> Q:
    """Armed slots more than ``OVERDUE_AFTER`` in the past: a semi-join on the armed slots
    (Note [Host filters at scale])."""
    return Q(alarm__in=overdue_slots(now).values("pk"))


def overdue_slots(now: datetime) -> QuerySet[Schedule]:
    """The armed slots more than ``OVERDUE_AFTER`` in the past (``da_schedule_armed_next_run``)."""
    slots: QuerySet[Schedule] = Schedule.objects.exclude(repeats=0)
    return slots.filter(next_run__lt=now - OVERDUE_AFTER)


def parked() -> Exists:
    return Exists(DueLane.objects.filter(host=OuterRef("pk"), state=LaneState.PARKED))


def faulted() -> Exists:
    return Exists(RecoveryFault.objects.filter(host=OuterRef("pk")))


def waiting_binding() -> Exists:
    return Exists(BindingRetry.objects.filter(host=OuterRef("pk")))


def dirty() -> Q:
    """A dirty generation (a missing state row counts as dirty)."""
    return Q(maintenance__isnull=True) | Q(maintenance__dirty__gt=F("maintenance__processed"))


def dirty_hosts() -> Q:
    """:func:`dirty` for a filter over many hosts (Note [Host filters at scale]): the hosts of
    the dirty state rows, and the hosts without a state row, found among the hosts without a
    slot (Note [A host without a state row has no slot])."""
    dirty_rows = MaintenanceState.objects.filter(dirty__gt=F("processed")).values("host_id")
    stateless = (
        Host.objects.filter(alarm__isnull=True)
        .filter(~Exists(MaintenanceState.objects.filter(host=OuterRef("pk"))))
        .order_by()
        .values("pk")
    )
    return Q(pk__in=dirty_rows.order_by().union(stateless, all=True))


def overdue_hosts(now: datetime) -> Q:
    """:func:`overdue` for a filter over many hosts (Note [Overdue slots are read first])."""
    late = overdue_slots(now)
    ids = list(late.order_by().values_list("pk", flat=True)[: OVERDUE_READ_AHEAD + 1])
    if len(ids) <= OVERDUE_READ_AHEAD:
        return Q(alarm__in=ids)
    return Q(alarm__in=late.values("pk"))


def parked_hosts() -> Q:
    """:func:`parked` for a filter over many hosts (Note [Host filters at scale])."""
    return Q(pk__in=DueLane.objects.parked().values("host_id"))


def failing_hosts() -> Q:
    """:func:`failing` for a filter over many hosts, without the annotation (Note [Host
    filters at scale]): the streak is computed for the hosts of the failed passes alone
    (every failing host has one), inside the semi-join."""
    failed = PassRecord.objects.filter(phase=PassPhase.FAILED).alias(
        streak=failure_streak(host="host_id")
    )
    return Q(pk__in=failed.filter(streak__gte=failing_after()).values("host_id"))


def failing() -> Q:
    """Needs :func:`failure_streak` annotated as ``failed_passes``."""
    return Q(failed_passes__gte=failing_after())


# -- annotations -----------------------------------------------------------------------------


def count_per_host(queryset: QuerySet[Any], host: str = "pk") -> Coalesce:
    """A correlated ``COUNT(*)`` of ``queryset`` rows of the outer host (0 when none);
    ``host`` names the outer query's host id."""
    counted = (
        queryset.filter(host=OuterRef(host))
        .order_by()
        .values("host")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def _last_pass(field: str, **extra: Any) -> Subquery:
    latest = PassRecord.objects.filter(host=OuterRef("pk"), **extra).order_by("-started_at", "-id")
    return Subquery(latest.values(field)[:1])


def failure_streak(host: str = "pk") -> Coalesce:
    """Failed passes since the host's last successful one (all of them when none succeeded);
    ``host`` names the outer query's host id."""
    last_ok = (
        PassRecord.objects.filter(host=OuterRef(OuterRef(host)), phase__in=SUCCEEDED)
        .order_by("-started_at")
        .values("started_at")[:1]
    )
    since = Coalesce(Subquery(last_ok, output_field=DateTimeField()), Value(_BEFORE_ANY_PASS))
    return count_per_host(
        PassRecord.objects.filter(phase=PassPhase.FAILED, started_at__gt=since), host=host
    )


def last_pass_error() -> Subquery:
    """The error of the host's latest failed pass (None when none failed)."""
    return _last_pass("error", phase=PassPhase.FAILED)


def annotate_hosts(queryset: QuerySet[Host]) -> QuerySet[Host]:
    """Every per-host figure of the read model, as annotations (no query per host).

    ``gen_dirty``/``gen_processed`` read a missing state row as ``1``/``0`` (one useful pass
    classifies whatever exists); ``slot_at`` is the armed slot time (None when disarmed).
    """
    return queryset.annotate(
        gen_dirty=Coalesce(F("maintenance__dirty"), Value(1)),
        gen_processed=Coalesce(F("maintenance__processed"), Value(0)),
        gen_lag=F("gen_dirty") - F("gen_processed"),
        gen_nonterminal=Coalesce(F("maintenance__nonterminal"), Value(0)),
        slot_at=Case(
            When(Q(alarm__isnull=True) | Q(alarm__repeats=0), then=Value(None)),
            default=F("alarm__next_run"),
            output_field=DateTimeField(),
        ),
        parked_lanes=count_per_host(DueLane.objects.filter(state=LaneState.PARKED)),
        open_faults=count_per_host(RecoveryFault.objects.all()),
        binding_waits=count_per_host(BindingRetry.objects.all()),
        failed_passes=failure_streak(),
        last_pass_phase=_last_pass("phase"),
        last_pass_lateness=_last_pass("lateness_ms"),
        last_pass_at=_last_pass("started_at"),
        last_error=last_pass_error(),
    )


# -- per-host verdicts -----------------------------------------------------------------------


def is_overdue(slot: datetime | None, now: datetime) -> bool:
    """An armed slot more than ``OVERDUE_AFTER`` in the past."""
    return slot is not None and slot < now - OVERDUE_AFTER


def overdue_by(slot: datetime | None, now: datetime) -> timedelta | None:
    """How late an armed slot is (None when it is not yet due)."""
    if slot is None or slot > now:
        return None
    return now - slot


@dataclass(frozen=True)
class Verdict:
    """What the read model says about one host (built from :func:`annotate_hosts`)."""

    armed: bool
    overdue: bool
    failing: bool
    failed_passes: int
    last_error: str
    parked_lanes: int
    faults: int
    binding_waits: int
    dirty: bool

    @property
    def healthy(self) -> bool:
        return not (self.overdue or self.failing or self.parked_lanes or self.faults)


def verdict(host: Host, now: datetime | None = None) -> Verdict:
    """The verdict of a host annotated by :func:`annotate_hosts`."""
    now = now or clock.now()
    slot = host.slot_at  # type: ignore[attr-defined]
    streak = int(host.failed_passes)  # type: ignore[attr-defined]
    return Verdict(
        armed=slot is not None,
        overdue=is_overdue(slot, now),
        failing=streak >= failing_after(),
        failed_passes=streak,
        last_error=host.last_error or "",  # type: ignore[attr-defined]
        parked_lanes=int(host.parked_lanes),  # type: ignore[attr-defined]
        faults=int(host.open_faults),  # type: ignore[attr-defined]
        binding_waits=int(host.binding_waits),  # type: ignore[attr-defined]
        dirty=host.gen_dirty > host.gen_processed,  # type: ignore[attr-defined]
    )


def failing_hint(error: str) -> str:
    """What an operator can do about a failing host, from its last pass error."""
    if error.startswith("LaneNotRegistered"):
        return (
            "A lane is scheduled but no handler is registered for it in the processes that "
            "run the passes: register the handler (durable_agent.lanes.register, in an "
            "AppConfig.ready()) and deploy. The next pass (or Run pass now) then succeeds and "
            "the host is healthy again."
        )
    return (
        "Every recent pass raised this error. Fix its cause (the traceback is in the worker "
        "log), then run a pass now from this page: the host is healthy again after one "
        "successful pass."
    )


# -- fleet figures ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetCounts:
    hosts: int
    armed: int
    due: int
    overdue: int
    parked: int
    faulted: int
    waiting_binding: int
    dirty: int
    failing: int
    suspended: int
    unknown: int


def fleet_counts(now: datetime) -> FleetCounts:
    """Host counts by state (one aggregate query) and owed submissions (one more)."""
    figures = Host.objects.annotate(
        is_parked=parked(),
        is_faulted=faulted(),
        is_waiting=waiting_binding(),
        failed_passes=failure_streak(),
    ).aggregate(
        hosts=Count("pk"),
        armed=Count("pk", filter=armed()),
        due=Count("pk", filter=armed() & Q(alarm__next_run__lte=now)),
        overdue=Count("pk", filter=overdue(now)),
        parked=Count("pk", filter=Q(is_parked=True)),
        faulted=Count("pk", filter=Q(is_faulted=True)),
        waiting_binding=Count("pk", filter=Q(is_waiting=True)),
        dirty=Count("pk", filter=dirty()),
        failing=Count("pk", filter=failing()),
    )
    owed = Submission.objects.filter(
        state__in=[SubmissionState.SUSPENDED, SubmissionState.UNKNOWN]
    ).aggregate(
        suspended=Count("pk", filter=Q(state=SubmissionState.SUSPENDED)),
        unknown=Count("pk", filter=Q(state=SubmissionState.UNKNOWN)),
    )
    return FleetCounts(**{key: int(value or 0) for key, value in {**figures, **owed}.items()})


@dataclass(frozen=True)
class FleetSnapshot:
    """Counts across every host, read in a constant number of queries (the metrics' fleet
    gauges and the health check).

    ``armed``: hosts whose slot is armed. ``overdue``: armed more than 60 s past the slot's
    time (the scheduler is not firing it). ``failing``: hosts whose last
    ``FAILING_AFTER_PASSES`` passes failed. ``parked``: parked lanes. ``owed``: submissions
    not settled.
    """

    hosts: int
    armed: int
    overdue: int
    failing: int
    parked: int
    owed: int


def fleet_snapshot(*, now: datetime | None = None) -> FleetSnapshot:
    """The fleet's counts now (four queries, whatever the number of hosts)."""
    now = now or clock.now()
    counts = fleet_counts(now)
    return FleetSnapshot(
        hosts=counts.hosts,
        armed=counts.armed,
        overdue=counts.overdue,
        failing=counts.failing,
        parked=DueLane.objects.filter(state=LaneState.PARKED).count(),
        owed=Submission.objects.exclude(state=SubmissionState.SETTLED).count(),
    )


def owed_work(host: Host) -> dict[str, int]:
    """A host's unsettled submissions by state (one query)."""
    rows = (
        Submission.objects.filter(host_id=host.pk)
        .exclude(state=SubmissionState.SETTLED)
        .order_by()
        .values("state")
        .annotate(n=Count("pk"))
    )
    found = {row["state"]: row["n"] for row in rows}
    return {
        state: int(found.get(state, 0)) for state in SubmissionState.values if state != "settled"
    }


# -- the commands' host choices ----------------------------------------------------------------


def due_hosts(*, now: datetime | None = None) -> list[Host]:
    """Hosts whose alarm slot is armed and due."""
    now = now or clock.now()
    return list(
        Host.objects.filter(armed(), alarm__next_run__lte=now)
        .select_related("alarm")
        .order_by("pk")
    )


def hosts_for_pass(*, keys: list[str], due: bool, all: bool) -> list[Host]:
    """The hosts a maintenance command names. Unknown keys are an error before anything runs."""
    if not keys and not due and not all:
        raise ValueError("Name hosts with --host KEY, or use --due or --all")
    if all and (keys or due):
        raise ValueError("--all cannot be combined with --host or --due")
    chosen: dict[int, Host] = {}
    if keys:
        found = {h.key: h for h in Host.objects.filter(key__in=keys)}
        missing = [key for key in keys if key not in found]
        if missing:
            raise ValueError(f"Unknown host key(s): {', '.join(missing)}")
        chosen.update({found[key].pk: found[key] for key in keys})
    if due:
        chosen.update({h.pk: h for h in due_hosts()})
    if all:
        chosen.update({h.pk: h for h in Host.objects.order_by("pk")})
    return list(chosen.values())
