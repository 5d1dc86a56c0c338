"""A changelist paginator for large tables: an estimated count, and pages read by their ids.

Note [Estimated host counts]
    Django's changelist counts its rows on every page view (``COUNT(*)``): at a million hosts
    the count reads the whole table and costs more than the page. Unfiltered, this paginator
    takes PostgreSQL's own estimate of the table's rows (``pg_class.reltuples``, kept by
    autovacuum and ``ANALYZE``) once it is above :data:`EXACT_BELOW` rows, so the figure of
    a large table is approximate (within a few percent after an ``ANALYZE``; the list reads
    "about N hosts") and the last pages may be short or empty. Below that, on another
    database, or with a filter or a search, it counts exactly; a list that sets
    ``estimate_filtered`` also takes the planner's estimate (``EXPLAIN``) of a large filtered
    count (Note [The submission list at scale] in ``durable_agent/admin/submission_list.py``).

Note [A page is read by its ids]
    A deep page (``OFFSET`` n) of an annotated queryset computes every annotation of the n
    rows it skips: at a million hosts a middle page took half a minute. So a page is read in
    two steps (a "deferred join"): the ordered ids of the page alone (the same filters and
    ordering, no annotation selected: an index scan of the sort key that skips n index
    entries), then the page's rows with their annotations, by id (``pk IN (...)``, in the
    same ordering). The annotations are computed for the rows shown and no others.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.core.paginator import Page, Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.functional import cached_property

#: Tables estimated at fewer rows than this are counted exactly.
EXACT_BELOW = 100_000
#: Filtered lists (``estimate_filtered``) the planner expects to hold fewer rows than this
#: are counted exactly: counting ten thousand rows on an index takes a few milliseconds.
FILTERED_EXACT_BELOW = 10_000


def estimated_rows(model: Any, using: str) -> int | None:
    """PostgreSQL's estimate of the rows of ``model``'s table (None elsewhere or unknown)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [model._meta.db_table]
        )
        row = cursor.fetchone()
    if row is None or row[0] is None or row[0] < 0:  # never analyzed
        return None
    return int(row[0])


def planned_rows(queryset: QuerySet[Any]) -> int | None:
    """The planner's estimate of the rows of ``queryset`` (PostgreSQL only, else None)."""
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    try:
        sql, params = queryset.query.sql_with_params()
    except EmptyResultSet:  # a condition that matches nothing (``none()``)
        return 0
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str | bytes):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts exactly unless the list is a whole large table (Note [Estimated host counts]);
    reads each page by its ids (Note [A page is read by its ids])."""

    #: Whether :attr:`count` is PostgreSQL's estimate (the list then reads "about N hosts").
    estimated = False
    #: Whether a filtered count above :data:`EXACT_BELOW` rows is the planner's estimate.
    estimate_filtered = False

    @cached_property
    def count(self) -> int:
        queryset: Any = self.object_list
        query = getattr(queryset, "query", None)
        if query is not None and not query.where:
            estimate = estimated_rows(queryset.model, queryset.db)
            if estimate is not None and estimate >= EXACT_BELOW:
                self.estimated = True
                return estimate
        if query is not None and query.where and self.estimate_filtered:
            estimate = planned_rows(queryset)
            if estimate is not None and estimate >= FILTERED_EXACT_BELOW:
                self.estimated = True
                return estimate
        return int(super().count)

    def page(self, number: Any) -> Page:  # type: ignore[type-arg]
        page = super().page(number)
        if isinstance(self.object_list, QuerySet) and isinstance(page.object_list, QuerySet):
            page.object_list = page_by_ids(self.object_list, page.object_list)
        return page


def page_by_ids(queryset: QuerySet[Any], sliced: QuerySet[Any]) -> QuerySet[Any]:
    """The rows of ``sliced`` (a slice of ``queryset``), read by their ids: Note [A page is
    read by its ids]. The result is a queryset in ``queryset``'s ordering."""
    ids = list(sliced.values_list("pk", flat=True))
    return queryset.filter(pk__in=ids)
