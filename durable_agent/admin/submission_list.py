"""The submission list at a million rows: its count, its search and its agent filter.

Note [The submission list at scale]
    The ledger keeps every submission, so the admin's list must answer at a million rows
    (``bench/admin_submissions.py`` measures it). Each part of the page avoids reading the
    whole table:

    - the ordering (``-updated_at, -id``) is the ``da_submission_updated`` index, so a page
      is an index scan that stops after its rows; only the id and the ordering sort
      (``sortable_by``), both indexed;
    - the count is PostgreSQL's estimate once it is large: the table's ``reltuples``
      unfiltered, the planner's row estimate (``EXPLAIN``) with a filter or a search; below
      :data:`~durable_agent.admin.paging.EXACT_BELOW` rows (unfiltered) or
      :data:`~durable_agent.admin.paging.FILTERED_EXACT_BELOW` (filtered), or on another
      database, it is exact. An estimate reads "about N submissions";
    - the search takes whole keys: a host key, a thread key, an idempotency key, an agent
      name or a submission id. The host and thread keys are looked up first (their unique
      and ``da_thread_key`` indexes), so the list's condition is an ``OR`` of indexed
      columns (``host_id``, ``thread_id``, ``idempotency_key``; ``agent`` only when the term
      names a registered agent); a substring search would read every row;
    - the agent filter lists the agents this process has registered (the agent registry),
      not a ``SELECT DISTINCT agent`` over the table; an agent no longer registered is
      still reached by its name in the search box or the filter's URL.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from durable_agent.admin.paging import EstimatedCountPaginator
from durable_agent.agents import registry
from durable_agent.models import Host, Submission, Thread
from durable_agent.text import unstorable

#: The most thread ids a search term can match (a thread key is unique per host only).
SEARCH_IDS = 1_000


class SubmissionPaginator(EstimatedCountPaginator):
    """Estimates a large filtered count too (Note [The submission list at scale])."""

    estimate_filtered = True


def search(queryset: QuerySet[Submission], term: str) -> QuerySet[Submission]:
    """The submissions a whole key, agent name or id names (Note [The submission list at
    scale])."""
    term = term.strip()
    if not term:
        return queryset
    if unstorable(term) is not None:  # no key holds it
        return queryset.none()
    hosts = list(Host.objects.filter(key=term).order_by().values_list("pk", flat=True)[:1])
    threads = list(
        Thread.objects.filter(key=term).order_by().values_list("pk", flat=True)[:SEARCH_IDS]
    )
    condition = Q(idempotency_key=term)
    if hosts:
        condition |= Q(host_id__in=hosts)
    if threads:
        condition |= Q(thread_id__in=threads)
    if term in {spec.name for spec in registry.registered()}:
        condition |= Q(agent=term)
    if term.isdigit() and len(term) < 19:
        condition |= Q(pk=int(term))
    return queryset.filter(condition)


class AgentFilter(admin.SimpleListFilter):
    """The registered agents (Note [The submission list at scale]); the parameter keeps the
    name of Django's field filter, so older links still filter."""

    title = "agent"
    parameter_name = "agent__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = {spec.name for spec in registry.registered()}
        chosen = self.value()
        if chosen:
            names.add(chosen)
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if unstorable(value) is not None:
            return queryset.none()
        return queryset.filter(agent=value)
