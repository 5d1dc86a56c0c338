"""Changelist filters over the annotations of :func:`durable_agent.admin.queries.annotate_hosts`
and of the ledger admins."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from durable_agent import clock
from durable_agent.admin import queries
from durable_agent.models import SubmissionState


class _YesNoFilter(admin.SimpleListFilter):
    """A yes/no filter: subclasses give ``condition()`` (a Q or an expression)."""

    yes = "yes"
    no = "no"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", self.yes), ("no", self.no)]

    def condition(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(self.condition())
        if self.value() == "no":
            return queryset.exclude(self.condition())
        return queryset


class OverdueFilter(_YesNoFilter):
    title = "overdue"
    parameter_name = "overdue"
    yes = f"overdue (> {int(queries.OVERDUE_AFTER.total_seconds())} s late)"
    no = "on time or disarmed"

    def condition(self) -> Q:
        return queries.overdue_hosts(clock.now())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        # Not ``exclude()``: a NULL slot (disarmed) must count as "not overdue".
        if self.value() == "no":
            cutoff = clock.now() - queries.OVERDUE_AFTER
            return queryset.filter(Q(slot_at__isnull=True) | Q(slot_at__gte=cutoff))
        return super().queryset(request, queryset)


class FailingFilter(_YesNoFilter):
    title = "failing"
    parameter_name = "failing"
    yes = "failing (recent passes all failed)"
    no = "not failing"

    def condition(self) -> Q:
        return queries.failing_hosts()


class ParkedFilter(_YesNoFilter):
    title = "parked lanes"
    parameter_name = "parked"
    yes = "has parked lanes"
    no = "no parked lanes"

    def condition(self) -> Q:
        return queries.parked_hosts()


class FaultedFilter(_YesNoFilter):
    title = "recovery faults"
    parameter_name = "faulted"
    yes = "has open faults"
    no = "no faults"

    def condition(self) -> Q:
        return Q(queries.faulted())


class DirtyFilter(_YesNoFilter):
    title = "generation"
    parameter_name = "dirty"
    yes = "dirty (dirty > processed)"
    no = "caught up"

    def condition(self) -> Q:
        return queries.dirty_hosts()


class BindingFilter(_YesNoFilter):
    title = "binding retries"
    parameter_name = "binding"
    yes = "waiting for a binding"
    no = "none"

    def condition(self) -> Q:
        return Q(queries.waiting_binding())


class HeadFilter(_YesNoFilter):
    title = "head of its thread"
    parameter_name = "head"
    yes = "the head"
    no = "queued behind the head, or settled"

    def condition(self) -> Q:
        return Q(is_head=True)


class AbortRequestedFilter(_YesNoFilter):
    title = "abort requested"
    parameter_name = "abort_requested"

    def condition(self) -> Q:
        return Q(abort_requested_at__isnull=False)


class ActiveThreadFilter(_YesNoFilter):
    title = "activity"
    parameter_name = "active"
    yes = "has nonterminal submissions"
    no = "idle (all settled)"

    def condition(self) -> Q:
        return Q(nonterminal__gt=0)


class HeadStateFilter(admin.SimpleListFilter):
    title = "head state"
    parameter_name = "head_state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (value, label)
            for value, label in SubmissionState.choices
            if value != SubmissionState.SETTLED
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(head_state=value) if value else queryset
