"""What the host page shows: one read of everything a host owns, shaped into display rows."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durable_agent.admin import formatting as fmt
from durable_agent.maintenance import selectors
from durable_agent.maintenance.lane_ids import FRAMEWORK_LANES
from durable_agent.maintenance.operators.audit import HostAudit, audit_host
from durable_agent.maintenance.store.rows import slot_deadline
from durable_agent.maintenance.store.selectors import OVERDUE_AFTER, overdue_by
from durable_agent.maintenance.types import EPOCH
from durable_agent.models import (
    AlarmAudit,
    BindingRetry,
    DueLane,
    Host,
    LaneState,
    MaintenanceState,
    MutationTicket,
    PassRecord,
    RecoveryEvent,
    RecoveryFault,
    WorkCursor,
)
from durable_agent.runtime import get_runtime

RECENT_EVENTS = 20
RECENT_PASSES = 20
RECENT_AUDITS = 50


@dataclass(frozen=True)
class Fact:
    label: str
    value: str
    note: str = ""
    tone: str = ""  # "", "ok", "warn" or "bad": a CSS class suffix


@dataclass(frozen=True)
class LaneRow:
    pk: int
    lane: str
    state: str
    due: str
    due_relative: str
    not_before: str
    stalls: int
    revision: int
    progress_key: str
    reported: bool
    framework: bool
    sets_alarm: bool

    @property
    def parked(self) -> bool:
        return self.state == LaneState.PARKED


@dataclass(frozen=True)
class Row:
    """A generic table row: ``pk`` for actions, ``cells`` in column order."""

    pk: int
    cells: tuple[str, ...]
    key: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HostPage:
    host: Host
    now: datetime
    facts: tuple[Fact, ...]
    lanes: tuple[LaneRow, ...]
    slot_lane: str | None
    tickets: tuple[Row, ...]
    expired_tickets: int
    binding_retries: tuple[Row, ...]
    cursors: tuple[Row, ...]
    faults: tuple[Row, ...]
    events: tuple[Row, ...]
    passes: tuple[Row, ...]
    audits: tuple[Row, ...]
    audit: HostAudit
    owed: dict[str, int] = field(default_factory=dict)

    @property
    def failing_hint(self) -> str:
        return selectors.failing_hint(self.audit.last_error) if self.audit.failing else ""

    @property
    def parked_lanes(self) -> int:
        return sum(1 for lane in self.lanes if lane.parked)


def _json(value: Any) -> str:
    if value in (None, {}, []):
        return ""
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


def due_text(when: datetime | None, now: datetime) -> tuple[str, str]:
    """A lane deadline and how far it is; the epoch means "as soon as possible"."""
    if when is None:
        return "idle", ""
    if when == EPOCH:
        return "as soon as possible", "due"
    return fmt.timestamp(when), fmt.relative(when, now)


def _lane_order(lane: DueLane) -> tuple[bool, datetime | None, str]:
    return (lane.due_at is None, lane.due_at, lane.lane)


def slot_setter(lanes: list[DueLane]) -> DueLane | None:
    """The lane whose deadline is the earliest: the one the alarm slot is armed for."""
    timed = [lane for lane in lanes if lane.due_at is not None]
    return min(timed, key=_lane_order) if timed else None


def _owed_text(owed: dict[str, int], binding_waits: int) -> tuple[str, str, str]:
    """The "Owed work" fact: unsettled submissions by state, and heads waiting for a binding."""
    parts = [
        f"{owed.get('ready', 0)} ready",
        f"{owed.get('running', 0)} running",
        f"{owed.get('suspended', 0)} suspended (waiting for approval)",
        f"{owed.get('unknown', 0)} unknown (to resolve)",
        f"{binding_waits} waiting for a binding",
    ]
    stuck = owed.get("suspended", 0) + owed.get("unknown", 0) + binding_waits
    note = "needs an operator" if stuck else ""
    return ", ".join(parts), note, "warn" if stuck else ""


def _health(audit: HostAudit) -> Fact:
    if audit.failing:
        return Fact(
            "Health",
            "FAILING",
            f"the last {audit.failed_passes} passes failed: {audit.last_error}",
            "bad",
        )
    if audit.failed_passes:
        return Fact(
            "Health",
            "recovering",
            f"{audit.failed_passes} failed pass{'es' if audit.failed_passes > 1 else ''} in a "
            f"row (failing at {selectors.failing_after()})",
            "warn",
        )
    return Fact("Health", "passes succeed", "", "ok")


def _facts(
    host: Host,
    state: MaintenanceState | None,
    audit: HostAudit,
    now: datetime,
    owed: dict[str, int],
    binding_waits: int,
) -> tuple[Fact, ...]:
    slot = slot_deadline(host.alarm)
    late = overdue_by(slot, now)
    if slot is None:
        slot_fact = Fact("Alarm slot", "disarmed", "nothing owed" if audit.ok else "", "")
    elif late is not None:
        tone = "bad" if late > OVERDUE_AFTER else "warn"
        slot_fact = Fact(
            "Alarm slot", fmt.timestamp(slot), f"overdue by {fmt.duration_between(now, slot)}", tone
        )
    else:
        slot_fact = Fact("Alarm slot", fmt.timestamp(slot), fmt.relative(slot, now), "ok")
    dirty, processed = (state.dirty, state.processed) if state else (1, 0)
    facts = [
        _health(audit),
        Fact("Owed work", *_owed_text(owed, binding_waits)),
        Fact("Kind", "single-thread" if host.single_thread else "shared"),
        Fact(
            "Generations",
            f"dirty {dirty} / processed {processed}",
            f"lag {dirty - processed}" + ("" if state else " (no state row yet)"),
            "warn" if dirty > processed else "ok",
        ),
        slot_fact,
        Fact(
            "Earliest lane deadline",
            *(due_text(audit.earliest_due, now) if audit.earliest_due else ("none", "")),
        ),
        Fact(
            "Invariant",
            "holds" if audit.ok else "VIOLATED",
            "; ".join(audit.violations),
            "ok" if audit.ok else "bad",
        ),
    ]
    if state is not None:
        if state.pass_lease_owner:
            expires = state.pass_lease_expires_at
            stale = expires is not None and expires <= now
            facts.append(
                Fact(
                    "Pass lease",
                    state.pass_lease_owner,
                    ("expired " if stale else "expires ") + fmt.relative(expires, now),
                    "warn" if stale else "",
                )
            )
        if state.retry_generation is not None:
            facts.append(
                Fact(
                    "Native backoff",
                    f"not before {fmt.timestamp(state.retry_not_before)}",
                    f"generation {state.retry_generation}, {state.retry_stalls} stalls"
                    + (", native only" if state.retry_native_only else ""),
                    "warn",
                )
            )
        facts += [
            Fact("Nonterminal work", str(state.nonterminal)),
            Fact(
                "Recovery events",
                f"sequence {state.recovery_event_sequence}, "
                f"acknowledged {state.recovery_event_acknowledged}",
                "undelivered" if state.has_recovery_events else "",
                "warn" if state.has_recovery_events else "",
            ),
            Fact("Binding registry key", state.binding_registry_key or "-"),
            Fact("Last served thread", state.last_served_thread or "-"),
        ]
    facts.append(Fact("Created", fmt.timestamp(host.created_at)))
    return tuple(facts)


def load(host: Host, now: datetime) -> HostPage:
    """Read everything the host page shows (a fixed number of queries)."""
    state = MaintenanceState.objects.filter(host_id=host.pk).first()
    lanes = sorted(DueLane.objects.filter(host_id=host.pk), key=_lane_order)
    setter = slot_setter(lanes)
    # The same audit as the API and the health endpoint (registry key included).
    audit = audit_host(
        host,
        now=now,
        state=state,
        lanes=lanes,
        registry_key=get_runtime().binding_registry_key(),
    )
    owed = selectors.owed_work(host)
    retries = list(BindingRetry.objects.filter(host_id=host.pk).order_by("reported_at", "pk"))
    tickets = list(MutationTicket.objects.filter(host_id=host.pk).order_by("created_at", "pk"))
    live = [ticket for ticket in tickets if ticket.expires_at > now]
    return HostPage(
        host=host,
        now=now,
        facts=_facts(host, state, audit, now, owed, len(retries)),
        lanes=tuple(
            LaneRow(
                pk=lane.pk,
                lane=lane.lane,
                state=lane.state,
                due=due_text(lane.due_at, now)[0],
                due_relative=due_text(lane.due_at, now)[1],
                not_before=fmt.timestamp(lane.not_before) if lane.not_before else "",
                stalls=lane.stalls,
                revision=lane.revision,
                progress_key=lane.progress_key or "",
                reported=lane.reported,
                framework=lane.lane in FRAMEWORK_LANES,
                sets_alarm=setter is not None and lane.pk == setter.pk,
            )
            for lane in lanes
        ),
        slot_lane=setter.lane if setter else None,
        tickets=tuple(
            Row(
                t.pk,
                (
                    str(t.pk),
                    ", ".join(str(lane) for lane in t.lanes) or "-",
                    "yes" if t.invalidates_recovery else "no",
                    fmt.timestamp(t.created_at),
                    f"{fmt.timestamp(t.expires_at)} ({fmt.relative(t.expires_at, now)})",
                ),
            )
            for t in live
        ),
        expired_tickets=len(tickets) - len(live),
        binding_retries=tuple(
            Row(
                r.pk,
                (
                    r.thread,
                    r.submission,
                    str(r.attempts),
                    fmt.timestamp(r.reported_at),
                    r.registry_key or "-",
                ),
                key=str(r.pk),
            )
            for r in retries
        ),
        cursors=tuple(
            Row(c.pk, (c.thread, c.cursor[:120], fmt.timestamp(c.updated_at)))
            for c in WorkCursor.objects.filter(host_id=host.pk).order_by("thread")
        ),
        faults=tuple(
            Row(
                f.pk,
                (
                    f.thread,
                    str(f.attempts),
                    fmt.timestamp(f.first_failed_at),
                    fmt.timestamp(f.last_failed_at),
                    f"{fmt.timestamp(f.retry_at)} ({fmt.relative(f.retry_at, now)})",
                    _json(f.failure),
                ),
                key=f.thread,
            )
            for f in RecoveryFault.objects.filter(host_id=host.pk).order_by("retry_at", "pk")
        ),
        events=tuple(
            Row(
                e.pk,
                (
                    str(e.sequence),
                    e.transition,
                    e.thread,
                    e.submission,
                    fmt.timestamp(e.occurred_at),
                    fmt.timestamp(e.delivered_at) if e.delivered_at else "pending",
                    _json(e.failure),
                ),
            )
            for e in RecoveryEvent.objects.filter(host_id=host.pk).order_by("-sequence")[
                :RECENT_EVENTS
            ]
        ),
        passes=tuple(
            Row(
                p.pk,
                (
                    fmt.timestamp(p.started_at),
                    p.phase,
                    fmt.duration_between(p.finished_at, p.started_at) if p.finished_at else "-",
                    fmt.duration(p.lateness_ms),
                    str(p.recovered),
                    str(p.settled),
                    p.alarm or "-",
                    "" if p.generation is None else str(p.generation),
                    p.error,
                ),
                extra={"failed": bool(p.error)},
            )
            for p in PassRecord.objects.filter(host_id=host.pk).order_by("-started_at", "-id")[
                :RECENT_PASSES
            ]
        ),
        audits=tuple(
            Row(
                a.pk,
                (
                    fmt.timestamp(a.at),
                    a.action,
                    a.actor,
                    a.reason,
                    _audit_deadline(a, a.old_deadline),
                    _audit_deadline(a, a.new_deadline),
                    str(a.generation),
                    _json(a.detail),
                ),
            )
            for a in AlarmAudit.objects.filter(host_id=host.pk).order_by("-at", "-id")[
                :RECENT_AUDITS
            ]
        ),
        audit=audit,
        owed=owed,
    )


def _audit_deadline(audit: AlarmAudit, deadline: Any) -> str:
    """An audit row's deadline; empty for a submission action, which does not move the slot."""
    if deadline is not None:
        return fmt.timestamp(deadline)
    return "" if "submission" in audit.detail else "disarmed"
