"""The submission list at scale (Note [The submission list at scale] in
durable_agent/admin/submission_list.py): whole-key search, the registered agents as the
agent filter, indexed sorts and an estimated count."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from durable_agent.admin import submission_list
from durable_agent.agents import registry
from durable_agent.models import Submission
from tests.admin.helpers import changelist
from tests.factories import HostFactory, SubmissionFactory, ThreadFactory

pytestmark = pytest.mark.django_db
URL = changelist("submission")


@pytest.fixture
def agents() -> Iterator[None]:
    saved = registry.snapshot()
    registry.restore({})
    registry.register("summarise", lambda ctx, payload: None)
    registry.register("refund", lambda ctx, payload: None, version="2")
    yield
    registry.restore(saved)


@pytest.fixture
def rows() -> dict[str, Submission]:
    billing, search = HostFactory(key="billing-eu"), HostFactory(key="search-us")
    talk = ThreadFactory(host=billing, key="order-1234")
    other = ThreadFactory(host=search, key="order-12345")
    return {
        "a": SubmissionFactory(thread=talk, sequence=1, agent="summarise", idempotency_key="m-1"),
        "b": SubmissionFactory(thread=talk, sequence=2, agent="refund", idempotency_key="m-2"),
        "c": SubmissionFactory(thread=other, sequence=1, agent="retired", idempotency_key="x"),
    }


def _found(client: Client, query: str, rows: dict[str, Submission]) -> set[str]:
    response = client.get(URL + query)
    assert response.status_code == 200
    ids = {row.pk for row in response.context["cl"].result_list}
    return {name for name, row in rows.items() if row.pk in ids}


def test_search__takes_whole_keys_agent_names_and_ids(
    operator_client: Client, agents: None, rows: dict[str, Submission]
) -> None:
    assert _found(operator_client, "?q=billing-eu", rows) == {"a", "b"}
    assert _found(operator_client, "?q=order-1234", rows) == {"a", "b"}
    assert _found(operator_client, "?q=order-12345", rows) == {"c"}
    assert _found(operator_client, "?q=m-2", rows) == {"b"}
    assert _found(operator_client, "?q=refund", rows) == {"b"}
    assert _found(operator_client, f"?q={rows['c'].pk}", rows) == {"c"}
    assert _found(operator_client, "?q=+order-1234+", rows) == {"a", "b"}
    # Substrings read every row at scale: they match nothing.
    assert _found(operator_client, "?q=order", rows) == set()
    assert _found(operator_client, "?q=billing", rows) == set()
    # A term no key can hold is an empty list, not a database error.
    for term in ("\x00", "order-1234\ud800"):
        assert not submission_list.search(Submission.objects.all(), term).exists()


def test_agent_filter__lists_the_registered_agents_without_reading_the_table(
    operator_client: Client, agents: None, rows: dict[str, Submission]
) -> None:
    with CaptureQueriesContext(connection) as queries:
        response = operator_client.get(URL)
    assert not [q for q in queries.captured_queries if "DISTINCT" in q["sql"].upper()]
    spec = response.context["cl"].filter_specs[-1]
    assert spec.title == "agent"
    assert [value for value, _ in spec.lookup_choices] == ["refund", "summarise"]
    assert _found(operator_client, "?agent__exact=summarise", rows) == {"a"}
    # An agent no longer registered is still reached by its link, and listed while chosen.
    chosen = operator_client.get(URL + "?agent__exact=retired")
    assert [v for v, _ in chosen.context["cl"].filter_specs[-1].lookup_choices] == [
        "refund",
        "retired",
        "summarise",
    ]
    assert _found(operator_client, "?agent__exact=retired", rows) == {"c"}
    assert _found(operator_client, "?agent__exact=%00", rows) == set()


def test_columns__ordered_by_updated_at_with_its_arrow_and_only_indexed_sorts(
    operator_client: Client, rows: dict[str, Submission]
) -> None:
    html = operator_client.get(URL).content.decode()
    cl = operator_client.get(URL).context["cl"]
    assert [getattr(c, "__name__", c) for c in cl.list_display[1:]] == [
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
    assert cl.get_ordering_field_columns() == {9: "desc"}
    assert 'class="sortable column-updated_at sorted descending' in html
    assert 'class="sortable column-id"' in html  # sortable, not sorted
    ids = [row.pk for row in cl.result_list]
    assert ids == list(
        Submission.objects.order_by("-updated_at", "-id").values_list("pk", flat=True)
    )
    assert "column-thread_link" in html
    assert "sortable column-thread_link" not in html
    assert f"order-1234</a> #{rows['b'].sequence}" in html


@pytest.mark.postgres
def test_count__a_large_filtered_or_searched_list_is_the_planners_estimate(
    operator_client: Client, agents: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_agent.admin import paging

    thread = ThreadFactory(key="busy")
    SubmissionFactory.create_batch(30, thread=thread)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_agent_submission")
    monkeypatch.setattr(paging, "EXACT_BELOW", 5)
    monkeypatch.setattr(paging, "FILTERED_EXACT_BELOW", 5)
    for query in ("", "?state__exact=ready", "?q=busy", "?agent__exact=summarise"):
        with CaptureQueriesContext(connection) as queries:
            response = operator_client.get(URL + query)
        counts = [q for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
        if query == "?agent__exact=summarise":  # the planner expects no row: counted
            assert response.context["cl"].result_count == 0
            assert counts
            continue
        assert not counts, query
        assert response.context["cl"].paginator.estimated
        assert "about " in response.content.decode()
    monkeypatch.setattr(paging, "FILTERED_EXACT_BELOW", 1_000)
    response = operator_client.get(URL + "?state__exact=ready")
    assert response.context["cl"].result_count == 30
    assert not response.context["cl"].paginator.estimated
