"""A changelist paginator that does not count a large table on every page view.

Note [Estimated host counts]
    Django's changelist counts its rows on every page view (``COUNT(*)``): at a million hosts
    the count reads the whole table and costs more than the page. Unfiltered, this paginator
    takes PostgreSQL's own estimate of the table's rows (``pg_class.reltuples``, kept by
    autovacuum and ``ANALYZE``) once it is above :data:`EXACT_BELOW` rows, so the figure of
    a large table is approximate (within a few percent after an ``ANALYZE``) and the last
    pages may be short or empty. Below that, on another database, or with a filter or a
    search, it counts exactly.
"""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property

#: Tables estimated at fewer rows than this are counted exactly.
EXACT_BELOW = 100_000


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


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts exactly unless the list is a whole large table (Note [Estimated host counts])."""

    @cached_property
    def count(self) -> int:
        queryset: Any = self.object_list
        query = getattr(queryset, "query", None)
        if query is not None and not query.where:
            estimate = estimated_rows(queryset.model, queryset.db)
            if estimate is not None and estimate >= EXACT_BELOW:
                return estimate
        return int(super().count)
