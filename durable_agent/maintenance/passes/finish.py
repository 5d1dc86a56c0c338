"""The end of a pass: its event deadline, the finish decision, and the backoff of a failure.

``settle_alarm`` is the finish decision inside an alarm transaction (re-arm at the earliest
lane, or clear; docs/pass.md, step 4), shared by ``finish`` (the general path) and the short
paths of ``durable_agent/maintenance/passes/waves.py``. ``rearm_failure`` durably schedules
bounded recovery after a failed pass (docs/pass.md, failures).

What a pass did: its ``PassReport``, and the ``PassRecord`` row that keeps it. ``write_record``
inserts the row (and about one pass in twenty prunes its host's history to ``PASS_HISTORY``
rows, Note [One trim in twenty, in any order]) inside whatever transaction calls it;
``record`` writes it in its own, never failing the pass for it; ``recorded`` follows a pass
whose last transaction already wrote it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from durable_agent import clock, conf, observability
from durable_agent.errors import AlarmError
from durable_agent.maintenance import backoff, failpoints
from durable_agent.maintenance.lane_ids import NATIVE
from durable_agent.maintenance.passes.ensure import report_parked
from durable_agent.maintenance.passes.state import Lease, Pass, release_in
from durable_agent.maintenance.store.rows import insert_row
from durable_agent.maintenance.store.transactions import (
    AlarmTx,
    no_sooner_than_minimum,
    run_alarm_transaction,
)
from durable_agent.models import Host, PassPhase, PassRecord
from durable_agent.text import error_text


def _deadline_message() -> str:
    minutes = conf.event_timeout().total_seconds() / 60
    shown = f"{minutes:g} minute" if minutes >= 1 else f"{conf.event_timeout().total_seconds():g} s"
    return f"The maintenance event exceeded its {shown} deadline; durable recovery remains pending"


def check_deadline(event_deadline: datetime) -> None:
    if clock.now() >= event_deadline:
        raise AlarmError("maintenance pass deadline", _deadline_message())


def finish(p: Pass, taken: Lease) -> None:
    """The final alarm decision: rearm at the earliest lane, or clear (docs/pass.md, step 4),
    into ``p.alarm``. Also gives the lease back, and says whether a lane waits for its parked
    notice (``p.parked``).
    """
    if p.finished:  # Note [The checkpoint finishes a pass that has nothing after it]
        return
    failpoints.hit("maintenance:finish:before")

    def fn(tx: AlarmTx) -> tuple[str, bool]:
        release_in(tx.state, taken)
        tx.commit_unflushed()  # Note [Begin does not wait for the flush]
        now = clock.now()
        return settle_alarm(tx, p.generation, p.next_at, tx.live_ticket_count(now), now)

    p.alarm, p.parked = run_alarm_transaction(p.host, "finish maintenance event", fn)
    failpoints.hit("maintenance:finish:after")


def settle_alarm(
    tx: AlarmTx,
    generation: int | None,
    next_at: datetime | None,
    active: int,
    now: datetime,
) -> tuple[str, bool]:
    """The finish decision inside an alarm transaction: ``rearmed`` or ``cleared``, and whether
    a parked lane waits for its notice (docs/pass.md, step 4)."""
    state, queue = tx.state, tx.queue
    parked = any(row.parked and not row.reported for row in queue.read())
    delay = conf.minimum_alarm_delay()
    if active > 0 or state.dirty > state.processed:
        retry_at = tx.retry_deadline()
        if retry_at is not None and active == 0:
            native: datetime | None = no_sooner_than_minimum(retry_at, now)
        elif state.dirty == generation and active == 0:
            native = next_at or now + delay
        else:
            native = now + delay
    else:
        native = None
    queue.checkpoint_native(native)
    return ("cleared" if tx.arm_at_earliest(now) is None else "rearmed"), parked


def rearm_failure(p: Pass) -> None:
    """Failures durably schedule bounded recovery (docs/pass.md, failures)."""
    generation, native_only = p.generation, p.native_only
    if generation is None:
        return  # failed before begin_pass read anything
    failpoints.hit("maintenance:retry:before")
    now = clock.now()
    jitter = clock.random()
    delay = conf.minimum_alarm_delay()

    def fn(tx: AlarmTx) -> None:
        state, queue = tx.state, tx.queue
        active = tx.live_ticket_count(now)
        native_deadline = tx.back_off_failure(generation, native_only, now, jitter) or now + delay
        if active > 0 or state.dirty != generation:
            native_deadline = now + delay
        queue.checkpoint_native(
            native_deadline if (state.dirty > state.processed or active > 0) else None
        )
        with p.lock:
            seen, charged_revisions = list(p.seen.items()), dict(p.charged)
        for lane, row in seen:
            if lane == NATIVE:
                continue
            current = queue.find(lane)
            if current is None or row.due_at is None or row.due_at > now:
                continue
            charged = row if charged_revisions.get(lane) == row.revision else queue.claim(row, now)
            if charged is not None:
                queue.complete(
                    charged,
                    now + timedelta(milliseconds=backoff.backoff_delay_ms(charged.stalls, jitter)),
                )
        tx.arm_at_earliest(now)

    run_alarm_transaction(p.host, "back off failed maintenance", fn)
    failpoints.hit("maintenance:retry:after")


#: The longest ``error`` a ``PassRecord`` keeps.
MAX_PASS_ERROR_LENGTH = 2000

logger = logging.getLogger("durable_agent.maintenance")
log_extra = observability.log_extra


@dataclass(frozen=True)
class PassReport:
    """What one pass did.

    ``phase``: ``caught-up`` (no runtime work ran), ``actionable`` (recovery or selection ran)
    or ``busy`` (another pass holds the host). ``alarm``: ``rearmed`` or ``cleared`` (empty
    when busy). ``lateness_ms``: start minus the deadline the alarm fired for.
    """

    host: str
    phase: str
    recovered: int = 0
    settled: int = 0
    nonterminal: int = 0
    alarm: str = ""
    generation: int | None = None
    lateness_ms: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields by name (every value a str, an int or None: nothing to copy deeply)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def report_of(p: Pass, phase: str) -> PassReport:
    """The report of a pass that ended in ``phase`` (not failed, busy or stale)."""
    return PassReport(
        host=p.host.key,
        phase=phase,
        recovered=p.recovery.recovered,
        settled=p.settled,
        nonterminal=p.nonterminal,
        alarm=p.alarm,
        generation=p.generation,
        lateness_ms=p.lateness_ms,
    )


def recorded(host: Host, started_at: datetime, report: PassReport, parked: bool) -> PassReport:
    """After a pass whose last transaction also wrote its ``PassRecord``."""
    failpoints.hit("maintenance:finish:after")
    if parked:
        report_parked(host.pk)
    observability.pass_recorded(host, report, started_at=started_at, error=None)
    return report


def record(
    host: Host,
    started_at: datetime,
    report: PassReport,
    *,
    deadline: datetime | None,
    error: BaseException | None = None,
) -> None:
    try:
        write_record(host, started_at, report, deadline=deadline, error=error)
    except Exception:
        logger.exception("Recording a pass failed", extra=log_extra(host, action="record_pass"))
    observability.pass_recorded(host, report, started_at=started_at, error=error)


def record_pass(p: Pass, report: PassReport, *, deadline: datetime | None) -> None:
    """Record a pass of the general path, unless its checkpoint's transaction already wrote
    the record (Note [The checkpoint finishes a pass that has nothing after it] in
    ``passes/native.py``)."""
    if p.finished:
        observability.pass_recorded(p.host, report, started_at=p.started_at, error=None)
        return
    record(p.host, p.started_at, report, deadline=deadline)


def trims(record_id: int) -> bool:
    """Whether the pass whose record got ``record_id`` trims its host's history: about one
    in twenty.

    Note [One trim in twenty, in any order]
        The trim is one more statement (two when it deletes), so it runs for about one pass
        in twenty. The rule was ``record_id % 20 == host.pk % 20``: record ids and host ids
        both count up, so hosts passing in id order (a burst) or in turn (a round robin of
        twenty) kept the difference fixed, and then every pass trimmed or none ever did. The
        rule is now a Fibonacci hash of the record id alone: about one pass in twenty in any
        order of hosts, every host of a round robin trimming at its share, and the same
        answer for the same id (no random draw that a test pinning the jitter would see).
    """
    return (((record_id * 0x9E3779B1) & 0xFFFFFFFF) >> 16) % 20 == 0


def write_record(
    host: Host,
    started_at: datetime,
    report: PassReport,
    *,
    deadline: datetime | None,
    error: BaseException | None = None,
) -> None:
    """Insert the pass's ``PassRecord``; about one pass in twenty also prunes its host's
    history to ``PASS_HISTORY`` rows (:func:`trims`). Inside an alarm transaction on
    PostgreSQL the insert is part of its one write statement (Note [One write statement per
    alarm transaction] in ``durable_agent/maintenance/store/rows.py``), and the pruning
    follows it."""

    def prune(record_id: int) -> None:
        keep = conf.pass_history()
        if trims(record_id) or keep < 20:
            cutoff = (
                PassRecord.objects.filter(host=host)
                .order_by("-started_at", "-id")
                .values_list("id", flat=True)[keep : keep + 1]
            )
            boundary = list(cutoff)
            if boundary:
                PassRecord.objects.filter(host=host, id__lte=boundary[0]).delete()

    insert_row(
        PassRecord,
        {
            "host_id": host.pk,
            "started_at": started_at,
            "finished_at": clock.now(),
            "phase": report.phase,
            "recovered": report.recovered,
            "settled": report.settled,
            "alarm": report.alarm,
            "generation": report.generation,
            "error": "" if error is None else error_text(error, limit=MAX_PASS_ERROR_LENGTH),
            "deadline": deadline,
            "lateness_ms": report.lateness_ms,
        },
        then=prune,
    )


def record_failure(p: Pass, exc: BaseException) -> None:
    """A begun pass failed with ``exc``: back it off (durable recovery) and record it."""
    try:
        rearm_failure(p)
    except Exception:
        logger.exception(
            "Backing off a failed pass failed",
            extra=log_extra(p.host, action="rearm_failure"),
        )
    failed = PassReport(
        host=p.host.key,
        phase=PassPhase.FAILED.value,
        lateness_ms=p.lateness_ms,
        generation=p.generation,
    )
    record(p.host, p.started_at, failed, deadline=p.slot_time, error=exc)
