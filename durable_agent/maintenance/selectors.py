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
from django.db.models.lookups import GreaterThanOrEqual

from durable_agent import clock, conf
from durable_agent.models import (
    BindingRetry,
    DueLane,
    Host,
    LaneState,
    PassPhase,
    PassRecord,
    RecoveryFault,
    Submission,
    SubmissionState,
)

OVERDUE_AFTER = timedelta(seconds=60)
#: Pass phases that end a failure streak (a busy pass ran nothing; a stale one is not recorded).
SUCCEEDED = (PassPhase.CAUGHT_UP.value, PassPhase.ACTIONABLE.value)
_BEFORE_ANY_PASS = datetime(1970, 1, 1, tzinfo=UTC)


def failing_after() -> int:
    """``FAILING_AFTER_PASSES``: failed passes in a row that make a host failing."""
    return int(conf.get("FAILING_AFTER_PASSES"))


# -- filters (on a Host queryset) ------------------------------------------------------------


def armed() -> Q:
    return Q(alarm__isnull=False) & ~Q(alarm__repeats=0)


def overdue(now: datetime) -> Q:
    """Armed slots more than ``OVERDUE_AFTER`` in the past."""
    return armed() & Q(alarm__next_run__lt=now - OVERDUE_AFTER)


def parked() -> Exists:
    return Exists(DueLane.objects.filter(host=OuterRef("pk"), state=LaneState.PARKED))


def faulted() -> Exists:
    return Exists(RecoveryFault.objects.filter(host=OuterRef("pk")))


def waiting_binding() -> Exists:
    return Exists(BindingRetry.objects.filter(host=OuterRef("pk")))


def dirty() -> Q:
    """A dirty generation (a missing state row counts as dirty)."""
    return Q(maintenance__isnull=True) | Q(maintenance__dirty__gt=F("maintenance__processed"))


def failing_quickly() -> Q:
    """:func:`failing` for a filter over many hosts, without the annotation: the streak is
    computed only for hosts with a failed pass on record (every failing host has one), found
    by one hashed lookup of the failed passes' hosts instead of a subquery per host."""
    failed_hosts = PassRecord.objects.filter(phase=PassPhase.FAILED).values("host_id")
    streak = Case(
        When(pk__in=Subquery(failed_hosts), then=failure_streak()),
        default=Value(0),
        output_field=IntegerField(),
    )
    return Q(GreaterThanOrEqual(streak, failing_after()))


def failing() -> Q:
    """Needs :func:`failure_streak` annotated as ``failed_passes``."""
    return Q(failed_passes__gte=failing_after())


# -- annotations -----------------------------------------------------------------------------


def count_per_host(queryset: QuerySet[Any]) -> Coalesce:
    """A correlated ``COUNT(*)`` of ``queryset`` rows of the outer host (0 when none)."""
    counted = (
        queryset.filter(host=OuterRef("pk"))
        .order_by()
        .values("host")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def _last_pass(field: str, **extra: Any) -> Subquery:
    latest = PassRecord.objects.filter(host=OuterRef("pk"), **extra).order_by("-started_at", "-id")
    return Subquery(latest.values(field)[:1])


def failure_streak() -> Coalesce:
    """Failed passes since the host's last successful one (all of them when none succeeded)."""
    last_ok = (
        PassRecord.objects.filter(host=OuterRef(OuterRef("pk")), phase__in=SUCCEEDED)
        .order_by("-started_at")
        .values("started_at")[:1]
    )
    since = Coalesce(Subquery(last_ok, output_field=DateTimeField()), Value(_BEFORE_ANY_PASS))
    return count_per_host(PassRecord.objects.filter(phase=PassPhase.FAILED, started_at__gt=since))


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
