from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from durable_agent.maintenance import gate
from durable_agent.models import Host
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.admin.helpers import changelist, fail_recovery, park, wait_for_binding
from tests.factories import HostFactory, PassRecordFactory
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db


def _row(html: str, key: str) -> str:
    """The changelist row of host ``key`` (its <tr> ... </tr>)."""
    start = re.search(rf">{re.escape(key)}( <span[^>]*>single</span>)?</a>", html).start()
    return html[html.rindex("<tr", 0, start) : html.index("</tr>", start)]


def test_host_changelist__shows_generations_slot_lanes_faults_and_last_pass(
    operator_client: Client, host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    park(host, clock)
    wait_for_binding(host, runtime)
    fail_recovery(host, runtime)
    idle = HostFactory(key="idle", single_thread=True)

    html = operator_client.get(changelist("host")).content.decode()

    row = _row(html, host.key)
    assert 'class="da-kind"' not in row  # shared: the default, not marked
    # dirty / processed, in warning colours when they differ
    assert '<span class="da-tone-warn" title="lag 1">4 / 3</span>' in row
    # the slot: the fault's retry, 5 s on (its events were delivered in the pass itself)
    assert '2030-01-01</span> <span class="da-nowrap">00:02:08.050 UTC' in row
    assert "in 5.0 s" in row
    assert '<td class="field-parked"><span class="da-tone-bad">1</span></td>' in row
    assert '<td class="field-faults"><span class="da-tone-bad">1</span></td>' in row
    assert '<td class="field-binding_retries"><span class="da-tone-warn">1</span></td>' in row
    assert '<td class="field-last_pass">actionable</td>' in row
    idle_row = _row(html, idle.key)
    assert 'idle <span class="da-kind">single</span>' in idle_row
    assert "1 / 0" in idle_row  # no state row yet: one useful pass owed
    assert '<td class="field-slot">disarmed</td>' in idle_row
    assert '<td class="field-last_pass">-</td>' in idle_row


def test_host_changelist__overdue_slot_and_last_pass_lateness(
    operator_client: Client, host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    gate.schedule(host, "outbox", clock.now() + timedelta(seconds=10))
    PassRecordFactory(host=host, started_at=clock.now(), lateness_ms=1500, phase="caught-up")
    clock.advance(minutes=3)

    row = _row(operator_client.get(changelist("host")).content.decode(), host.key)

    assert '<span class="da-tone-bad">by 2 min 50 s</span>' in row
    assert '<td class="field-last_pass">caught-up, 1.5 s late</td>' in row


def _keys(client: Client, query: str) -> set[str]:
    response = client.get(changelist("host") + query)
    assert response.status_code == 200
    return {host.key for host in response.context["cl"].result_list}


def test_host_changelist__filters_and_search(
    operator_client: Client, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    late = HostFactory(key="late")
    caught_up(late)
    gate.schedule(late, "outbox", clock.now())
    clock.advance(minutes=2)  # "late" is 2 minutes overdue; the others are armed from here
    parked = HostFactory(key="parked")
    park(parked, clock)
    faulted = HostFactory(key="faulted")
    fail_recovery(faulted, runtime)
    binding = HostFactory(key="binding")
    wait_for_binding(binding, runtime)
    quiet = HostFactory(key="quiet")
    caught_up(quiet)
    fresh = HostFactory(key="fresh")  # no state row: dirty by definition
    everyone = {"parked", "faulted", "binding", "late", "quiet", "fresh"}

    assert _keys(operator_client, "?overdue=yes") == {"late"}
    assert _keys(operator_client, "?overdue=no") == everyone - {"late"}
    assert _keys(operator_client, "?parked=yes") == {"parked"}
    assert _keys(operator_client, "?parked=no") == everyone - {"parked"}
    assert _keys(operator_client, "?faulted=yes") == {"faulted"}
    assert _keys(operator_client, "?binding=yes") == {"binding"}
    assert "fresh" in _keys(operator_client, "?dirty=yes")
    assert _keys(operator_client, "?dirty=no") >= {"quiet"}
    assert _keys(operator_client, "?dirty=yes") & _keys(operator_client, "?dirty=no") == set()
    assert _keys(operator_client, "?q=fault") == {"faulted"}
    assert fresh.key in _keys(operator_client, "?o=4")  # sortable by the slot annotation


def _changelist_queries(client: Client) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(changelist("host"))
    assert response.status_code == 200
    return len(queries)


def test_host_changelist__constant_queries_for_1_and_50_hosts(
    operator_client: Client, clock: FakeClock
) -> None:
    def populate(host: Host) -> None:
        caught_up(host)
        gate.schedule(host, "outbox", clock.now() + timedelta(seconds=5))
        PassRecordFactory(host=host, started_at=clock.now(), lateness_ms=20)

    populate(HostFactory())
    one = _changelist_queries(operator_client)
    for _ in range(49):
        populate(HostFactory())
    assert Host.objects.count() == 50

    fifty = _changelist_queries(operator_client)

    assert one == fifty
    assert fifty <= 8, "session, user, permissions, counts and one page query"


def test_host_changelist__only_the_key_sorts_and_the_search_is_a_key_prefix(
    operator_client: Client,
) -> None:
    HostFactory(key="faulted")
    HostFactory(key="quiet")
    html = operator_client.get(changelist("host")).content.decode()
    assert html.count('class="sortable') == 1  # Note [Host pages at scale]
    assert 'class="sortable column-key_and_kind' in html
    assert _keys(operator_client, "?q=fault") == {"faulted"}
    assert _keys(operator_client, "?q=ault") == set()  # a prefix, not a substring


@pytest.mark.postgres
def test_host_changelist__an_unfiltered_large_table_is_counted_from_the_estimate(
    operator_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_agent.admin import paging

    HostFactory.create_batch(3)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_agent_host")
    HostFactory.create_batch(2)  # not in the estimate yet
    monkeypatch.setattr(paging, "EXACT_BELOW", 1)
    with CaptureQueriesContext(connection) as queries:
        response = operator_client.get(changelist("host"))
    assert response.context["cl"].result_count == 3  # the estimate
    assert '<span class="da-estimated"' in response.content.decode()
    assert "about 3 hosts" in response.content.decode()
    assert not [q for q in queries.captured_queries if q["sql"].startswith("SELECT COUNT(*)")]
    assert operator_client.get(changelist("host") + "?q=").context["cl"].result_count == 3
    filtered = operator_client.get(changelist("host") + "?single_thread__exact=0")
    assert filtered.context["cl"].result_count == 5  # a filtered list is counted exactly
    assert "da-estimated" not in filtered.content.decode()


def test_host_changelist__a_deep_page_computes_the_columns_of_its_rows_alone(
    operator_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_agent.admin.hosts import HostAdmin

    for key in ("a", "b", "c", "d", "e"):
        HostFactory(key=key)
    monkeypatch.setattr(HostAdmin, "list_per_page", 2)
    with CaptureQueriesContext(connection) as captured:
        response = operator_client.get(changelist("host") + "?p=2")
    assert [h.key for h in response.context["cl"].result_list] == ["c", "d"]
    pages = [q["sql"] for q in captured.captured_queries if "durable_agent_passrecord" in q["sql"]]
    assert len(pages) == 1  # Note [A page is read by its ids]
    assert "OFFSET" not in pages[0]
    assert " IN (" in pages[0]
    ids = [q["sql"] for q in captured.captured_queries if "OFFSET 2" in q["sql"]]
    assert len(ids) == 1
    assert ids[0].startswith('SELECT "durable_agent_host"."id" AS "pk" FROM')


def test_host_changelist__dirty_reads_dirty_state_rows_and_hosts_without_one(
    operator_client: Client, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    owed = HostFactory(key="owed")
    caught_up(owed)
    runtime.submit(owed, "t1")  # a newer generation: dirty > processed
    quiet = HostFactory(key="quiet")
    caught_up(quiet)
    HostFactory(key="fresh")  # no state row, no slot: dirty=1, processed=0
    assert _keys(operator_client, "?dirty=yes") == {"owed", "fresh"}
    assert _keys(operator_client, "?dirty=no") == {"quiet"}


def test_host_changelist__failing_counts_the_failures_since_the_last_success(
    operator_client: Client, clock: FakeClock
) -> None:
    def passes(key: str, *phases: str) -> None:
        host = HostFactory(key=key)
        for n, phase in enumerate(phases):
            PassRecordFactory(host=host, phase=phase, started_at=clock.now() + timedelta(n))

    passes("failing", "caught-up", "failed", "failed", "failed")
    passes("recovered", "failed", "failed", "failed", "caught-up")
    passes("twice", "failed", "failed")
    passes("busy-between", "failed", "busy", "failed", "failed")
    HostFactory(key="never")
    assert _keys(operator_client, "?failing=yes") == {"failing", "busy-between"}
    assert _keys(operator_client, "?failing=no") == {"recovered", "twice", "never"}


def test_host_changelist__overdue_past_the_read_ahead_is_a_semi_join(
    operator_client: Client, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_agent.maintenance import selectors

    for key in ("late-1", "late-2", "on-time"):
        host = HostFactory(key=key)
        caught_up(host)
        gate.schedule(host, "outbox", clock.now() + timedelta(minutes=5 if key == "on-time" else 0))
    clock.advance(minutes=2)
    assert _keys(operator_client, "?overdue=yes") == {"late-1", "late-2"}
    monkeypatch.setattr(selectors, "OVERDUE_READ_AHEAD", 1)  # Note [Overdue slots are read first]
    with CaptureQueriesContext(connection) as captured:
        assert _keys(operator_client, "?overdue=yes") == {"late-1", "late-2"}
    assert any("IN (SELECT" in q["sql"] for q in captured.captured_queries)
    assert _keys(operator_client, "?overdue=no") == {"on-time"}
