"""Admins of the reference ledger: threads (with their head) and submissions.

Read-only; abort, approve and reject are actions that call ``durable_agent.agents.services``
and need the same ``durable_agent.repair_host`` permission as the host repairs. The ledger
services take no actor or reason, so the admin records both in the object's admin history
(Django's ``LogEntry``, shown by the History button).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import (
    BooleanField,
    Case,
    Count,
    Exists,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.templatetags.static import static
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from durable_agent.admin import filters, submission_list
from durable_agent.admin.base import ReadOnlyAdmin
from durable_agent.admin.confirm import Confirmation, confirm
from durable_agent.admin.forms import ReasonForm
from durable_agent.agents import services
from durable_agent.models import Submission, SubmissionState, Thread

QUEUE_SHOWN = 50


def _nonterminal_of_thread() -> QuerySet[Submission]:
    return (
        Submission.objects.filter(thread=OuterRef("pk"))
        .exclude(state=SubmissionState.SETTLED)
        .order_by("sequence")
    )


def _counted(queryset: QuerySet[Submission]) -> Coalesce:
    counted = queryset.order_by().values("thread").annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def _admin_url(site: admin.AdminSite, model: str, view: str, *args: Any) -> str:
    return reverse(
        f"{site.name}:durable_agent_{model}_{view}", args=list(args), current_app=site.name
    )


@admin.register(Thread)
class ThreadAdmin(ReadOnlyAdmin[Thread]):
    list_display = ["key", "host_link", "head", "head_state", "nonterminal_count", "total_count"]
    list_filter = [filters.ActiveThreadFilter, filters.HeadStateFilter]
    list_select_related = ["host"]
    search_fields = ["key", "host__key"]
    ordering = ["host__key", "key"]
    fields = ["host", "key", "created_at", "head", "queue", "all_submissions"]
    readonly_fields = ["head", "queue", "all_submissions"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Thread]:
        nonterminal = _nonterminal_of_thread()
        return (
            super()
            .get_queryset(request)
            .annotate(
                head_id=Subquery(nonterminal.values("pk")[:1]),
                head_sequence=Subquery(nonterminal.values("sequence")[:1]),
                head_state=Subquery(nonterminal.values("state")[:1]),
                nonterminal=_counted(
                    Submission.objects.filter(thread=OuterRef("pk")).exclude(
                        state=SubmissionState.SETTLED
                    )
                ),
                total=_counted(Submission.objects.filter(thread=OuterRef("pk"))),
            )
        )

    @admin.display(description="host", ordering="host__key")
    def host_link(self, thread: Thread) -> str:
        url = _admin_url(self.admin_site, "host", "change", thread.host_id)
        return format_html('<a href="{}">{}</a>', url, thread.host.key)

    @admin.display(description="head (oldest nonterminal)")
    def head(self, thread: Thread) -> str:
        head_id = getattr(thread, "head_id", None)
        if head_id is None:
            return "-"
        url = _admin_url(self.admin_site, "submission", "change", head_id)
        return format_html(
            '<a href="{}">#{} (submission {})</a>',
            url,
            getattr(thread, "head_sequence", ""),
            head_id,
        )

    @admin.display(description="head state", ordering="head_state")
    def head_state(self, thread: Thread) -> str:
        return str(getattr(thread, "head_state", None) or "-")

    @admin.display(description="nonterminal", ordering="nonterminal")
    def nonterminal_count(self, thread: Thread) -> int:
        return int(getattr(thread, "nonterminal", 0))

    @admin.display(description="submissions", ordering="total")
    def total_count(self, thread: Thread) -> int:
        return int(getattr(thread, "total", 0))

    @admin.display(description=f"queue (first {QUEUE_SHOWN} nonterminal)")
    def queue(self, thread: Thread) -> str:
        rows = (
            Submission.objects.filter(thread=thread)
            .exclude(state=SubmissionState.SETTLED)
            .order_by("sequence")[:QUEUE_SHOWN]
        )
        items = format_html_join(
            "",
            '<tr><td><a href="{}">#{}</a></td><td>{}</td><td>{}@{}</td><td>{}</td></tr>',
            (
                (
                    _admin_url(self.admin_site, "submission", "change", row.pk),
                    row.sequence,
                    row.state,
                    row.agent,
                    row.agent_version,
                    row.attempts,
                )
                for row in rows
            ),
        )
        if not items:
            return "all settled"
        return format_html(
            '<table class="da-table"><thead><tr><th>seq</th><th>state</th><th>agent</th>'
            "<th>attempts</th></tr></thead><tbody>{}</tbody></table>",
            items,
        )

    @admin.display(description="all submissions")
    def all_submissions(self, thread: Thread) -> str:
        url = _admin_url(self.admin_site, "submission", "changelist")
        return format_html('<a href="{}?thread__id__exact={}">list them</a>', url, thread.pk)


@admin.register(Submission)
class SubmissionAdmin(ReadOnlyAdmin[Submission]):
    """Size: one ModelAdmin: its list, its detail page and its actions."""

    # Nine columns fit a 1400 px window beside the filters: the thread's key and the
    # sequence share a column, as do the state and the outcome.
    list_display = [
        "id",
        "thread_link",
        "host_key",
        "agent_binding",
        "state_shown",
        "is_head",
        "attempts_shown",
        "abort_requested",
        "updated_at",
    ]
    list_filter = [
        "state",
        "outcome",
        filters.HeadFilter,
        filters.AbortRequestedFilter,
        submission_list.AgentFilter,
    ]
    list_select_related = ["thread", "host"]
    search_help_text = (
        "Search by a whole host key, thread key, idempotency key, agent name or submission id."
    )
    # Note [The submission list at scale]: indexed ordering and sorts, an estimated count.
    # Django appends "-pk" itself (ORDER BY updated_at DESC, id DESC: the index); naming only
    # updated at puts the one sort arrow on the column the list is ordered by.
    ordering = ["-updated_at"]
    # Only the id and updated at sort: no other column has an ordering.
    paginator = submission_list.SubmissionPaginator
    show_full_result_count = False
    actions = ["abort_submissions", "approve_submissions", "reject_submissions"]
    change_form_template = "admin/durable_agent/submission/change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Submission]:
        earlier = Submission.objects.filter(
            thread=OuterRef("thread"), sequence__lt=OuterRef("sequence")
        ).exclude(state=SubmissionState.SETTLED)
        return (
            super()
            .get_queryset(request)
            .annotate(
                is_head=Case(
                    When(Q(state=SubmissionState.SETTLED), then=Value(False)),
                    When(Exists(earlier), then=Value(False)),
                    default=Value(True),
                    output_field=BooleanField(),
                )
            )
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Submission], search_term: str
    ) -> tuple[QuerySet[Submission], bool]:
        return submission_list.search(queryset, search_term), False

    def get_search_fields(self, request: HttpRequest) -> list[str]:
        return ["idempotency_key"]  # shows the search box; get_search_results searches

    @admin.display(description="thread #")
    def thread_link(self, submission: Submission) -> str:
        url = _admin_url(self.admin_site, "thread", "change", submission.thread_id)
        return format_html(
            '<a href="{}">{}</a> #{}', url, submission.thread.key, submission.sequence
        )

    @admin.display(description="host")
    def host_key(self, submission: Submission) -> str:
        url = _admin_url(self.admin_site, "host", "change", submission.host_id)
        return format_html('<a href="{}">{}</a>', url, submission.host.key)

    @admin.display(description="agent")
    def agent_binding(self, submission: Submission) -> str:
        return f"{submission.agent}@{submission.agent_version}"

    @admin.display(description="state")
    def state_shown(self, submission: Submission) -> str:
        if submission.outcome:
            return f"{submission.state}: {submission.outcome}"
        return str(submission.state)

    @admin.display(description="abort requested")
    def abort_requested(self, submission: Submission) -> str:
        if submission.abort_requested_at is None:
            return "-"
        icon = static("admin/img/icon-yes.svg")
        return format_html(
            '<img src="{}" alt="True" title="{}">', icon, submission.abort_requested_at
        )

    @admin.display(description="attempts")
    def attempts_shown(self, submission: Submission) -> int:
        return int(submission.attempts)

    @admin.display(description="head")
    def is_head(self, submission: Submission) -> str:
        # A tick for the head, a cross for work queued behind it, nothing for settled work
        # (a settled submission is not "not the head": the question does not apply).
        if submission.state == SubmissionState.SETTLED:
            return "-"
        head = bool(getattr(submission, "is_head", False))
        icon = static(f"admin/img/icon-{'yes' if head else 'no'}.svg")
        return format_html('<img src="{}" alt="{}">', icon, head)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        submission = (
            Submission.objects.select_related("thread", "host").filter(pk=object_id).first()
            if object_id.isdigit()
            else None
        )
        if submission is not None:
            context["title"] = (
                f"Submission {submission.pk}: thread {submission.thread.key} "
                f"#{submission.sequence} ({submission.state})"
            )
            context["suspended"] = submission.state == SubmissionState.SUSPENDED
            context["can_repair"] = self.has_repair_permission(request)
            context["submission_actions_url"] = _admin_url(
                self.admin_site, "submission", "changelist"
            )
            context["here"] = request.get_full_path()
        return super().change_view(request, object_id, form_url, context)

    # -- actions ---------------------------------------------------------------------------

    def _ledger_action(
        self,
        request: HttpRequest,
        queryset: QuerySet[Submission],
        *,
        action: str,
        title: str,
        button: str,
        explanation: str,
        call: Any,
    ) -> HttpResponse | None:
        def run(submission: Submission, data: dict[str, Any]) -> str:
            status = call(submission.pk, actor=request.user, reason=data["reason"])
            self.log_change(request, submission, f"{action}: {data['reason']}")
            state = status.state + (f"/{status.outcome}" if status.outcome else "")
            return (
                f"Submission {status.submission_id} (thread {status.thread} "
                f"#{status.sequence}): {action} accepted; now {state}"
                + (", abort requested." if status.abort_requested else ".")
            )

        return confirm(
            self,
            request,
            queryset.select_related("thread", "host"),
            Confirmation(
                action=f"{action}_submissions",
                title=title,
                button=button,
                explanation=explanation,
                run=run,
                form_class=ReasonForm,
                describe=lambda s: (
                    f"submission {s.pk} (thread {s.thread.key} #{s.sequence}, {s.state})"
                ),
            ),
        )

    @admin.action(permissions=["repair"], description="Abort the selected submissions")
    def abort_submissions(
        self, request: HttpRequest, queryset: QuerySet[Submission]
    ) -> HttpResponse | None:
        return self._ledger_action(
            request,
            queryset,
            action="abort",
            title="Abort submissions",
            button="Abort",
            explanation=(
                "A ready, suspended or unknown submission settles 'aborted' at once, without "
                "running (for an unknown one, whether its side effect happened stays unknown: "
                "resolve it instead to record what happened); a running one sees "
                "ctx.cancelled() and settles 'aborted' when its agent returns. Settled "
                "submissions are refused."
            ),
            call=services.abort,
        )

    @admin.action(permissions=["repair"], description="Approve the selected suspended submissions")
    def approve_submissions(
        self, request: HttpRequest, queryset: QuerySet[Submission]
    ) -> HttpResponse | None:
        return self._ledger_action(
            request,
            queryset,
            action="approve",
            title="Approve submissions",
            button="Approve",
            explanation=(
                "Each suspended submission becomes ready and its agent runs again from the "
                "start with the approval granted. Submissions that are not suspended are "
                "refused."
            ),
            call=services.approve,
        )

    @admin.action(permissions=["repair"], description="Reject the selected suspended submissions")
    def reject_submissions(
        self, request: HttpRequest, queryset: QuerySet[Submission]
    ) -> HttpResponse | None:
        return self._ledger_action(
            request,
            queryset,
            action="reject",
            title="Reject submissions",
            button="Reject",
            explanation=(
                "Each suspended submission settles 'failed' with error reason 'rejected'. "
                "Submissions that are not suspended are refused."
            ),
            call=lambda pk, **audit: services.approve(pk, approved=False, **audit),
        )
