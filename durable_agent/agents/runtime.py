"""The reference runtime: the runtime protocol over the ledger models (docs/pass.md).

It is the default ``RUNTIME`` (``"durable_agent.agents.runtime.ReferenceRuntime"``). Thread
identifiers are ``Thread.key``; submission identifiers are ``str(Submission.pk)``. The class
holds no state, so one instance serves every host and every worker thread.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import FilteredRelation, Q, QuerySet

from durable_agent.agents import attempts, recovery, registry
from durable_agent.compiled import CompiledRead
from durable_agent.models import Host, MaintenanceState, Submission, SubmissionState
from durable_agent.runtime import DiscoveryPage, RecoverySweep, Settlement, WorkItem


class ReferenceRuntime:
    """The DB-backed runtime: threads, FIFO submissions, leases and recovery."""

    #: Discovery finds expired leases and abort intents, both on submissions the scan returns
    #: (``Runtime``'s optional attribute): after an empty scan the pass does not ask it.
    discovery_within_scan = True

    def binding_registry_key(self) -> str:
        """The registry's order-insensitive digest of every (name, version) binding."""
        return registry.registry_key()

    def scan_nonterminal(self, host: Host) -> list[WorkItem]:
        """Every nonterminal submission of ``host``: by thread key, FIFO within a thread.

        An ``unknown`` submission of an agent registered with ``strict_order=True`` holds
        its thread (see :func:`durable_agent.agents.attempts.holds_thread`). A ``ready``
        submission without an abort intent is not ``recoverable``: ``run_recovery`` changes
        only expired leases and abort intents (``durable_agent/agents/recovery.py``).
        """
        return [_item(*row) for row in _SCAN.rows(int(host.pk))]

    def scan_nonterminal_with_generation(self, host: Host) -> tuple[list[WorkItem], int] | None:
        """:meth:`scan_nonterminal` and the host's generation (``MaintenanceState.dirty``),
        read by one statement (the optional method of ``Runtime``); None when the host has no
        state row yet.

        One statement reads both from one snapshot: every submission committed with a
        generation at or below the one returned is in the scan, and none committed after it
        is (a producer advances the generation in the transaction that admits the work).
        """
        rows = _SCAN_WITH_GENERATION.rows(int(host.pk))
        if not rows:
            return None
        items = [_item(*row[1:]) for row in rows if row[2] is not None]
        return items, int(rows[0][0])

    def discover_work_threads(self, host: Host, after: str | None, limit: int) -> DiscoveryPage:
        """Threads owning recoverable work (expired leases, abort intents), after ``after``."""
        return recovery.discover_work_threads(host, after, limit)

    def run_recovery(self, host: Host, thread: str, cursor: str | None) -> RecoverySweep:
        """Recover one page (32 submissions) of ``thread``, from ``cursor``."""
        return recovery.run_recovery(host, thread, cursor)

    def process_thread_head(
        self, host: Host, thread: str, yield_after: datetime
    ) -> Settlement | None:
        """Claim the head of ``thread``, run its agent and settle it (or suspend it)."""
        return attempts.process_thread_head(host, thread, yield_after)

    def read_abort_intent(self, host: Host, submission: str) -> datetime | None:
        """When an abort was requested for a ``ready`` (unclaimed) submission, else None."""
        if not submission.isascii() or not submission.isdigit():
            return None
        requested: datetime | None = (
            Submission.objects.filter(pk=int(submission), host=host, state=SubmissionState.READY)
            .values_list("abort_requested_at", flat=True)
            .first()
        )
        return requested


def _scan(host_id: int) -> QuerySet[Submission, tuple[Any, ...]]:
    return (
        Submission.objects.nonterminal()
        .filter(host_id=host_id)
        .order_by("thread__key", "sequence")
        .values_list(
            "thread__key",
            "pk",
            "state",
            "agent",
            "agent_version",
            "not_before",
            "abort_requested_at",
        )
    )


def _scan_with_generation(host_id: int) -> QuerySet[MaintenanceState, tuple[Any, ...]]:
    open_ = FilteredRelation(
        "host__submissions", condition=~Q(host__submissions__state=SubmissionState.SETTLED)
    )
    return (
        MaintenanceState.objects.filter(host_id=host_id)
        .annotate(open=open_)
        .order_by("open__thread__key", "open__sequence")
        .values_list(
            "dirty",
            "open__thread__key",
            "open__id",
            "open__state",
            "open__agent",
            "open__agent_version",
            "open__not_before",
            "open__abort_requested_at",
        )
    )


# Both scans run in every actionable pass: compiled once (Note [Reads compiled once] in
# durable_agent/compiled.py).
_SCAN = CompiledRead(Submission, _scan)
_SCAN_WITH_GENERATION = CompiledRead(MaintenanceState, _scan_with_generation)


def _item(
    key: str,
    pk: int,
    state: str,
    agent: str,
    version: str,
    not_before: datetime | None,
    abort_requested: datetime | None,
) -> WorkItem:
    """One scanned submission (Note [A thread with nothing to recover is not swept])."""
    return WorkItem(
        thread=key,
        submission=str(pk),
        state=state,
        holds_thread=attempts.holds_thread(state, agent, version),
        not_before=not_before,
        recoverable=state != SubmissionState.READY or abort_requested is not None,
    )
