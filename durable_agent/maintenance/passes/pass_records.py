"""What a pass did: its ``PassReport``, and the ``PassRecord`` row that keeps it.

``write_record`` inserts the row (and about every 20th pass of a host prunes that host's
history to ``PASS_HISTORY`` rows) inside whatever transaction calls it; ``record`` writes it
in its own, never failing the pass for it; ``recorded`` follows a pass whose last transaction
already wrote it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from durable_agent import clock, conf, observability
from durable_agent.maintenance import failpoints
from durable_agent.maintenance.passes.ensure import report_parked
from durable_agent.maintenance.passes.state import Pass
from durable_agent.models import Host, PassRecord
from durable_agent.text import error_text

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
        return asdict(self)


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


def write_record(
    host: Host,
    started_at: datetime,
    report: PassReport,
    *,
    deadline: datetime | None,
    error: BaseException | None = None,
) -> None:
    """Insert the pass's ``PassRecord``; about every 20th pass of a host also prunes its
    history to ``PASS_HISTORY`` rows."""
    record = PassRecord.objects.create(
        host=host,
        started_at=started_at,
        finished_at=clock.now(),
        phase=report.phase,
        recovered=report.recovered,
        settled=report.settled,
        alarm=report.alarm,
        generation=report.generation,
        error="" if error is None else error_text(error, limit=MAX_PASS_ERROR_LENGTH),
        deadline=deadline,
        lateness_ms=report.lateness_ms,
    )
    keep = conf.pass_history()
    if record.pk % 20 == host.pk % 20 or keep < 20:  # about every 20th pass of each host
        cutoff = (
            PassRecord.objects.filter(host=host)
            .order_by("-started_at", "-id")
            .values_list("id", flat=True)[keep : keep + 1]
        )
        boundary = list(cutoff)
        if boundary:
            PassRecord.objects.filter(host=host, id__lte=boundary[0]).delete()
