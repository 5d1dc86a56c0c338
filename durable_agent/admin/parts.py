"""Admins of a host's maintenance rows: lanes, binding retries, recovery faults, the audit
trail and the pass history. The repairs of lanes, retries and faults live here."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

from durable_agent.admin import formatting as fmt
from durable_agent.admin.base import HostPartAdmin
from durable_agent.admin.confirm import Confirmation, confirm
from durable_agent.admin.forms import ReasonForm
from durable_agent.maintenance import repairs
from durable_agent.models import (
    AlarmAudit,
    BindingRetry,
    DueLane,
    PassRecord,
    RecoveryFault,
)

ERROR_SHOWN = 90
"""Characters of a pass error shown in the pass list (the whole error is its tooltip)."""


class _HostLinkMixin:
    """A ``host_link`` column (the host page) for admins of rows with a ``host`` FK."""

    admin_site: admin.AdminSite

    @admin.display(description="host", ordering="host__key")
    def host_link(self, obj: Any) -> str:
        name = self.admin_site.name
        url = reverse(f"{name}:durable_agent_host_change", args=[obj.host_id], current_app=name)
        return format_html('<a href="{}">{}</a>', url, obj.host.key)


def _pretty(value: Any) -> str:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True))


@admin.register(DueLane)
class DueLaneAdmin(_HostLinkMixin, HostPartAdmin[DueLane]):
    list_display = [
        "lane",
        "host_link",
        "state",
        "due_at",
        "not_before",
        "stalls",
        "revision",
        "progress_key",
        "reported",
    ]
    list_filter = ["state", "reported"]
    list_select_related = ["host"]
    search_fields = ["lane", "host__key"]
    ordering = ["host__key", "lane"]
    actions = ["unpark_lanes"]

    @admin.action(permissions=["repair"], description="Unpark the selected lanes")
    def unpark_lanes(
        self, request: HttpRequest, queryset: QuerySet[DueLane]
    ) -> HttpResponse | None:
        def run(lane: DueLane, data: dict[str, Any]) -> str:
            result = repairs.lane_unpark(
                host=lane.host_id, lane=lane.lane, actor=request.user, reason=data["reason"]
            )
            return (
                f"{result.host}: lane {lane.lane} unparked with a fresh budget, due now; "
                f"slot {fmt.timestamp(result.alarm)}."
            )

        return confirm(
            self,
            request,
            queryset.select_related("host"),
            Confirmation(
                action="unpark_lanes",
                title="Unpark lanes",
                button="Unpark",
                explanation=(
                    "Gives each parked lane a fresh budget (0 stalls), due now, and re-arms "
                    "its host's slot; the next pass runs the lane's handler again. One audit "
                    "row per lane."
                ),
                run=run,
                form_class=ReasonForm,
                describe=lambda lane: f"{lane.host.key}: lane {lane.lane} ({lane.state})",
            ),
        )


@admin.register(BindingRetry)
class BindingRetryAdmin(_HostLinkMixin, HostPartAdmin[BindingRetry]):
    list_display = ["thread", "submission", "host_link", "attempts", "reported_at", "registry_key"]
    list_select_related = ["host"]
    search_fields = ["thread", "submission", "host__key"]
    ordering = ["reported_at", "pk"]
    actions = ["retry_bindings"]

    @admin.action(permissions=["repair"], description="Retry the selected binding waits now")
    def retry_bindings(
        self, request: HttpRequest, queryset: QuerySet[BindingRetry]
    ) -> HttpResponse | None:
        def run(retry: BindingRetry, data: dict[str, Any]) -> str:
            result = repairs.binding_retry_now(
                host=retry.host_id, retry_id=retry.pk, actor=request.user, reason=data["reason"]
            )
            return (
                f"{result.host}: submission {retry.submission} of thread {retry.thread} "
                f"released for one more attempt; slot {fmt.timestamp(result.alarm)}."
            )

        return confirm(
            self,
            request,
            queryset.select_related("host"),
            Confirmation(
                action="retry_bindings",
                title="Retry binding waits",
                button="Retry now",
                explanation=(
                    "Releases each head parked because its agent binding was unavailable for "
                    "one more attempt (one native opportunity) and re-arms its host. If the "
                    "binding is still missing, the head parks again. One audit row each."
                ),
                run=run,
                form_class=ReasonForm,
                describe=lambda r: f"{r.host.key}: thread {r.thread}, submission {r.submission}",
            ),
        )


@admin.register(RecoveryFault)
class RecoveryFaultAdmin(_HostLinkMixin, HostPartAdmin[RecoveryFault]):
    list_display = [
        "thread",
        "host_link",
        "attempts",
        "first_failed_at",
        "last_failed_at",
        "retry_at",
        "failure_summary",
    ]
    list_select_related = ["host"]
    search_fields = ["thread", "host__key"]
    ordering = ["retry_at", "pk"]
    readonly_fields = ["failure_pretty", "recipients_pretty"]
    exclude = ["failure", "recipients"]
    actions = ["retry_faults"]

    @admin.display(description="failure")
    def failure_summary(self, fault: RecoveryFault) -> str:
        failure = fault.failure if isinstance(fault.failure, dict) else {}
        return " / ".join(str(failure[k]) for k in ("phase", "reason") if failure.get(k)) or "-"

    @admin.display(description="failure")
    def failure_pretty(self, fault: RecoveryFault) -> str:
        return _pretty(fault.failure)

    @admin.display(description="recipients")
    def recipients_pretty(self, fault: RecoveryFault) -> str:
        return _pretty(fault.recipients)

    @admin.action(permissions=["repair"], description="Retry the selected faults' recovery now")
    def retry_faults(
        self, request: HttpRequest, queryset: QuerySet[RecoveryFault]
    ) -> HttpResponse | None:
        def run(fault: RecoveryFault, data: dict[str, Any]) -> str:
            result = repairs.fault_retry_now(
                host=fault.host_id, thread=fault.thread, actor=request.user, reason=data["reason"]
            )
            return (
                f"{result.host}: recovery of thread {fault.thread} retried at the next pass; "
                f"slot {fmt.timestamp(result.alarm)}."
            )

        return confirm(
            self,
            request,
            queryset.select_related("host"),
            Confirmation(
                action="retry_faults",
                title="Retry recovery faults now",
                button="Retry now",
                explanation=(
                    "Moves each fault's retry time to now and re-arms its host, so the next "
                    "pass retries the thread's recovery instead of waiting for its backoff. "
                    "One audit row each."
                ),
                run=run,
                form_class=ReasonForm,
                describe=lambda f: f"{f.host.key}: thread {f.thread} ({f.attempts} attempts)",
            ),
        )


@admin.register(AlarmAudit)
class AlarmAuditAdmin(_HostLinkMixin, HostPartAdmin[AlarmAudit]):
    list_display = [
        "at",
        "host_link",
        "action",
        "actor",
        "reason",
        "old_deadline",
        "new_deadline",
        "generation",
    ]
    list_filter = ["action"]
    list_select_related = ["host"]
    search_fields = ["host__key", "actor", "reason"]
    date_hierarchy = "at"
    ordering = ["-at", "-id"]
    readonly_fields = ["detail_pretty"]
    exclude = ["detail"]

    @admin.display(description="detail")
    def detail_pretty(self, audit: AlarmAudit) -> str:
        return _pretty(audit.detail)


@admin.register(PassRecord)
class PassRecordAdmin(_HostLinkMixin, HostPartAdmin[PassRecord]):
    list_display = [
        "started_at",
        "host_link",
        "phase_shown",
        "lateness",
        "duration",
        "work",
        "alarm_and_generation",
        "error_shown",
    ]
    list_filter = ["phase", "alarm"]
    list_select_related = ["host"]
    search_fields = ["host__key", "error"]
    date_hierarchy = "started_at"
    ordering = ["-started_at", "-id"]

    @admin.display(description="phase", ordering="phase")
    def phase_shown(self, record: PassRecord) -> str:
        # The class lets the stylesheet highlight the whole row of a failed pass.
        return format_html(
            '<span class="da-phase da-phase-{}">{}</span>', record.phase, record.phase
        )

    @admin.display(description="error")
    def error_shown(self, record: PassRecord) -> str:
        if not record.error:
            return ""
        first = record.error.splitlines()[0]
        short = first if len(first) <= ERROR_SHOWN else first[: ERROR_SHOWN - 1] + "…"
        return format_html('<span class="da-error" title="{}">{}</span>', record.error, short)

    @admin.display(description="recovered / settled")
    def work(self, record: PassRecord) -> str:
        return f"{record.recovered} / {record.settled}"

    @admin.display(description="alarm (generation)", ordering="alarm")
    def alarm_and_generation(self, record: PassRecord) -> str:
        alarm = record.alarm or "-"
        return alarm if record.generation is None else f"{alarm} ({record.generation})"

    @admin.display(description="lateness", ordering="lateness_ms")
    def lateness(self, record: PassRecord) -> str:
        return fmt.duration(record.lateness_ms)

    @admin.display(description="duration")
    def duration(self, record: PassRecord) -> str:
        if record.finished_at is None:
            return "-"
        return fmt.duration_between(record.finished_at, record.started_at)
