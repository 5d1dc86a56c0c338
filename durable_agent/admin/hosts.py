"""The host admin: the changelist, the host page, the dashboard and the host repairs."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from durable_agent import clock
from durable_agent.admin import dashboard, filters, host_page, queries
from durable_agent.admin import formatting as fmt
from durable_agent.admin.base import ReadOnlyAdmin
from durable_agent.admin.confirm import Confirmation, confirm
from durable_agent.admin.forms import RearmAtForm, ReasonForm
from durable_agent.admin.paging import EstimatedCountPaginator
from durable_agent.maintenance import alarm, repairs, selectors
from durable_agent.maintenance.store.rows import slot_deadline
from durable_agent.models import Host


def _slot_text(when: Any) -> str:
    return fmt.timestamp(when) if when else "disarmed"


def _badge(tone: str, text: str) -> str:
    return format_html('<span class="da-badge da-badge-{}">{}</span>', tone, text)


@admin.register(Host)
class HostAdmin(ReadOnlyAdmin[Host]):
    """Size: one ModelAdmin: its list, its detail page and its audited repair actions."""

    list_display = [
        "key_and_kind",
        "health",
        "generations",
        "slot",
        "parked",
        "faults",
        "binding_retries",
        "last_pass",
    ]
    list_display_links = ["key_and_kind"]
    list_filter = [
        filters.FailingFilter,
        filters.OverdueFilter,
        filters.ParkedFilter,
        filters.FaultedFilter,
        filters.DirtyFilter,
        filters.BindingFilter,
        "single_thread",
    ]
    list_select_related = ["alarm", "maintenance"]
    search_fields = ["key"]
    search_help_text = "Search by the start of a host key."
    ordering = ["key"]
    # Sorting by a computed column would compute it for every host (Note [Host pages at
    # scale]): only the key, which has an index, sorts.
    sortable_by = ["key_and_kind"]
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    actions = ["rearm_now", "rearm_at", "run_pass_now"]
    change_form_template = "admin/durable_agent/host/change_form.html"
    fields = ["key", "single_thread", "created_at"]

    class Media:
        css = {"all": ["durable_agent/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Host]:
        return queries.annotate_hosts(super().get_queryset(request))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Host], search_term: str
    ) -> tuple[QuerySet[Host], bool]:
        """Hosts whose key starts with the term.

        Note [Host pages at scale]
            The host list must answer at a million hosts: the page reads the hosts by key
            on its index and computes its columns for those rows only; the count is an
            estimate (Note [Estimated host counts] in ``durable_agent/admin/paging.py``);
            the filters are semi-joins on the tables that hold the condition (a parked lane,
            a fault, a binding retry, an armed slot's time) rather than on per-host figures;
            a key search is a prefix (``LIKE 'term%'``, on the key's pattern index) rather
            than a substring, which would read every key.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(key__startswith=term), False

    # -- columns ---------------------------------------------------------------------------

    @admin.display(description="health", ordering="-failed_passes")
    def health(self, host: Host) -> Any:
        seen = selectors.verdict(host)
        if seen.failing:
            return format_html(
                '<span class="da-badge da-badge-bad" title="{}">failing</span>',
                f"{seen.failed_passes} failed passes in a row: {seen.last_error[:200]}",
            )
        if seen.overdue:
            return _badge("bad", "overdue")
        if seen.parked_lanes:
            return _badge("warn", "parked")
        if seen.faults:
            return _badge("warn", "faulted")
        return _badge("ok", "ok")

    @admin.display(description="key", ordering="key")
    def key_and_kind(self, host: Host) -> Any:
        """The key, marked when the host is single-thread (shared is the default)."""
        if host.single_thread:
            return format_html('{} <span class="da-kind">single</span>', host.key)
        return host.key

    @admin.display(description="dirty / processed", ordering="gen_lag")
    def generations(self, host: Host) -> Any:
        dirty, processed = getattr(host, "gen_dirty", "?"), getattr(host, "gen_processed", "?")
        lag = getattr(host, "gen_lag", 0)
        if lag:
            return format_html(
                '<span class="da-tone-warn" title="lag {}">{} / {}</span>', lag, dirty, processed
            )
        return f"{dirty} / {processed}"

    @admin.display(description="slot", ordering="slot_at")
    def slot(self, host: Host) -> Any:
        """The slot's time and, below it, how far it is (or how late, in warning colours)."""
        slot_at = getattr(host, "slot_at", None)
        if slot_at is None:
            return "disarmed"
        now = clock.now()
        late = queries.overdue_by(slot_at, now)
        if late is None:
            when = format_html('<span class="da-muted">{}</span>', fmt.relative(slot_at, now))
        else:
            tone = "bad" if late > queries.OVERDUE_AFTER else "warn"
            when = format_html(
                '<span class="da-tone-{}">by {}</span>', tone, fmt.duration_between(now, slot_at)
            )
        day, _, time = fmt.timestamp(slot_at).partition(" ")
        return format_html(
            '<span class="da-nowrap">{}</span> <span class="da-nowrap">{}</span>'
            '<div class="da-slot-when">{}</div>',
            day,
            time,
            when,
        )

    @admin.display(description="parked", ordering="parked_lanes")
    def parked(self, host: Host) -> Any:
        count = getattr(host, "parked_lanes", 0)
        return format_html('<span class="da-tone-bad">{}</span>', count) if count else 0

    @admin.display(description="faults", ordering="open_faults")
    def faults(self, host: Host) -> Any:
        count = getattr(host, "open_faults", 0)
        return format_html('<span class="da-tone-bad">{}</span>', count) if count else 0

    @admin.display(description="binding waits", ordering="binding_waits")
    def binding_retries(self, host: Host) -> Any:
        count = getattr(host, "binding_waits", 0)
        return format_html('<span class="da-tone-warn">{}</span>', count) if count else 0

    @admin.display(description="last pass (lateness)", ordering="last_pass_at")
    def last_pass(self, host: Host) -> str:
        phase = getattr(host, "last_pass_phase", None)
        if not phase:
            return "-"
        lateness = getattr(host, "last_pass_lateness", None)
        if lateness is None:
            return str(phase)
        if lateness < 0:
            return f"{phase}, {fmt.duration(-lateness)} early"
        return f"{phase}, {fmt.duration(lateness)} late"

    # -- the host page and the dashboard ---------------------------------------------------

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        host = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if host is not None and self.has_view_permission(request, host):
            context.update(self._page_context(request, host))
        return super().change_view(request, object_id, form_url, context)

    def _page_context(self, request: HttpRequest, host: Host) -> dict[str, Any]:
        name = self.admin_site.name

        def changelist(model: str) -> str:
            return reverse(f"{name}:durable_agent_{model}_changelist", current_app=name)

        return {
            "page": host_page.load(host, clock.now()),
            "can_repair": self.has_repair_permission(request),
            "here": request.get_full_path(),
            "host_actions_url": changelist("host"),
            "lane_actions_url": changelist("duelane"),
            "binding_actions_url": changelist("bindingretry"),
            "fault_actions_url": changelist("recoveryfault"),
            "audit_list_url": changelist("alarmaudit") + f"?host__id__exact={host.pk}",
            "pass_list_url": changelist("passrecord") + f"?host__id__exact={host.pk}",
            "thread_list_url": changelist("thread") + f"?host__id__exact={host.pk}",
            "dashboard_url": reverse(f"{name}:durable_agent_host_dashboard", current_app=name),
        }

    def get_urls(self) -> list[URLPattern]:
        dashboard_url = path(
            "dashboard/",
            self.admin_site.admin_view(self.dashboard_view),
            name="durable_agent_host_dashboard",
        )
        return [dashboard_url, *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        name = self.admin_site.name

        def host_url(pk: int) -> str:
            return reverse(f"{name}:durable_agent_host_change", args=[pk], current_app=name)

        context = {
            **self.admin_site.each_context(request),
            "title": "Maintenance dashboard",
            "subtitle": None,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "dashboard": dashboard.load(clock.now(), host_url),
            "host_list_url": reverse(f"{name}:durable_agent_host_changelist", current_app=name),
            "submission_list_url": reverse(
                f"{name}:durable_agent_submission_changelist", current_app=name
            ),
            "media": self.media,
        }
        request.current_app = name
        return TemplateResponse(request, "admin/durable_agent/dashboard.html", context)

    # -- repairs ---------------------------------------------------------------------------

    @admin.action(permissions=["repair"], description="Rearm now (recompute the slot)")
    def rearm_now(self, request: HttpRequest, queryset: QuerySet[Host]) -> HttpResponse | None:
        def run(host: Host, data: dict[str, Any]) -> str:
            before = slot_deadline(host.alarm)
            after = alarm.rearm(host, actor=request.user, reason=data["reason"])
            return (
                f"{host.key}: slot recomputed, now {_slot_text(after)} (was {_slot_text(before)})."
            )

        return confirm(
            self,
            request,
            queryset,
            Confirmation(
                action="rearm_now",
                title="Rearm now",
                button="Rearm",
                explanation=(
                    "Recomputes each host's alarm slot from its lanes and its generation (the "
                    "earliest deadline, never sooner than the minimum delay) and writes one "
                    "audit row per host. A host that owes nothing is disarmed."
                ),
                run=run,
                form_class=ReasonForm,
            ),
        )

    @admin.action(permissions=["repair"], description="Rearm at a chosen time")
    def rearm_at(self, request: HttpRequest, queryset: QuerySet[Host]) -> HttpResponse | None:
        def run(host: Host, data: dict[str, Any]) -> str:
            before = slot_deadline(host.alarm)
            after = alarm.rearm(host, at=data["at"], actor=request.user, reason=data["reason"])
            return f"{host.key}: slot set to {_slot_text(after)} (was {_slot_text(before)})."

        return confirm(
            self,
            request,
            queryset,
            Confirmation(
                action="rearm_at",
                title="Rearm at a chosen time",
                button="Rearm",
                explanation=(
                    "Sets each host's alarm slot to the time below and writes one audit row "
                    "per host. A time later than work already due is refused (the slot must "
                    "hold the earliest deadline); a time more than 5 minutes in the past is "
                    "refused too."
                ),
                run=run,
                form_class=RearmAtForm,
            ),
        )

    @admin.action(permissions=["repair"], description="Run a maintenance pass now")
    def run_pass_now(self, request: HttpRequest, queryset: QuerySet[Host]) -> HttpResponse | None:
        def run(host: Host, data: dict[str, Any]) -> str:
            report = repairs.pass_now(host=host, actor=request.user, reason=data["reason"])
            return (
                f"{host.key}: pass {report.phase}, recovered {report.recovered}, "
                f"settled {report.settled}, alarm {report.alarm or 'unchanged'}."
            )

        return confirm(
            self,
            request,
            queryset,
            Confirmation(
                action="run_pass_now",
                title="Run a maintenance pass now",
                button="Run the pass",
                explanation=(
                    "Writes one audit row per host, then runs one maintenance pass of each "
                    "host in this request (agents may run). A host whose pass is already "
                    "running reports 'busy' and changes nothing."
                ),
                run=run,
                form_class=ReasonForm,
                catch_all=True,
            ),
        )
