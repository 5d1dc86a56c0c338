from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from ninja.testing import TestClient
from pytest_django import DjangoAssertNumQueries

from durable_agent.api.hosts import HEALTH_ERROR_CHARS, HEALTH_LISTED, encode_host_cursor
from durable_agent.api.submissions import encode_cursor
from durable_agent.maintenance import alarm
from durable_agent.models import DueLane, Host, MaintenanceState, PassRecord
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.api.conftest import assert_error, make_user
from tests.factories import (
    T0,
    AlarmAuditFactory,
    BindingRetryFactory,
    DueLaneFactory,
    HostFactory,
    MaintenanceStateFactory,
    PassRecordFactory,
    RecoveryFaultFactory,
    SubmissionFactory,
    ThreadFactory,
)

pytestmark = pytest.mark.django_db


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.fixture
def fleet(clock: FakeClock, runtime: ScriptedRuntime) -> dict[str, Host]:
    """Four hosts, each with one condition: overdue, parked, faulted, caught up."""
    hosts = {name: HostFactory(key=name) for name in ("a-overdue", "b-parked", "c-faulted", "d-ok")}
    alarm.rearm(hosts["a-overdue"], at=T0 - timedelta(minutes=2), actor="test")
    DueLaneFactory(host=hosts["b-parked"], lane="outbox", state="parked", stalls=8, due_at=None)
    RecoveryFaultFactory(host=hosts["c-faulted"], thread="t1")
    for name in ("b-parked", "c-faulted", "d-ok"):
        MaintenanceStateFactory(host=hosts[name], dirty=3, processed=3)
    return hosts


def keys(response: Any) -> list[str]:
    assert response.status_code == 200, response.json()
    return [item["key"] for item in response.json()["items"]]


def test_list_hosts__counts_and_slot(
    client: TestClient, fleet: dict[str, Host], read_auth: dict[str, str]
) -> None:
    body = client.get("/hosts", headers=read_auth).json()
    assert (body["limit"], body["next"]) == (50, None)
    assert "count" not in body  # no page counts the hosts (Note [Host pages])
    first = body["items"][0]
    assert first == {
        "key": "a-overdue",
        "single_thread": False,
        "created_at": first["created_at"],
        "alarm": "2029-12-31T23:58:00Z",
        "overdue": True,
        "failing": False,
        "failed_passes": 0,
        "dirty": 1,
        "processed": 0,
        "nonterminal": 0,
        "parked_lanes": 0,
        "faults": 0,
        "binding_retries": 0,
    }
    assert [(i["parked_lanes"], i["faults"], i["dirty"]) for i in body["items"][1:]] == [
        (1, 0, 3),
        (0, 1, 3),
        (0, 0, 3),
    ]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("overdue=true", ["a-overdue"]),
        ("overdue=false", ["b-parked", "c-faulted", "d-ok"]),
        ("parked=true", ["b-parked"]),
        ("faulted=true", ["c-faulted"]),
        ("faulted=false&parked=false", ["a-overdue", "d-ok"]),
        ("dirty=true", ["a-overdue"]),  # no state row reads dirty=1, processed=0
        ("dirty=false&overdue=false", ["b-parked", "c-faulted", "d-ok"]),
        ("limit=2", ["a-overdue", "b-parked"]),
    ],
)
def test_list_hosts__filters_and_pages(
    client: TestClient,
    fleet: dict[str, Host],
    read_auth: dict[str, str],
    query: str,
    expected: list[str],
) -> None:
    response = client.get(f"/hosts?{query}", headers=read_auth)
    assert keys(response) == expected


def test_list_hosts__pages_follow_next_by_id(
    client: TestClient, fleet: dict[str, Host], read_auth: dict[str, str]
) -> None:
    late = HostFactory(key="0-created-last")  # sorts first by key, comes last by id
    seen: list[str] = []
    url = "/hosts?limit=2"
    pages = 0
    while url:
        body = client.get(url, headers=read_auth).json()
        seen += [item["key"] for item in body["items"]]
        pages += 1
        url = f"/hosts?limit=2&cursor={body['next']}" if body["next"] else ""
    assert seen == [*fleet, late.key]
    assert pages == 3


def test_list_hosts__a_cursor_keeps_its_filters_and_skips_nothing_created_meanwhile(
    client: TestClient, fleet: dict[str, Host], read_auth: dict[str, str]
) -> None:
    first = client.get("/hosts?limit=1&overdue=false", headers=read_auth).json()
    assert [item["key"] for item in first["items"]] == ["b-parked"]
    HostFactory(key="e-new")
    rest = client.get(f"/hosts?overdue=false&cursor={first['next']}", headers=read_auth)
    assert keys(rest) == ["c-faulted", "d-ok", "e-new"]
    assert rest.json()["next"] is None


@pytest.mark.parametrize(
    "cursor", ["12", "h1.!!", "h1.", "h1.LTE", "s1.MQ", encode_host_cursor(5)[:-1] + "*"]
)
def test_list_hosts__a_bad_cursor_is_422_invalid_cursor(
    client: TestClient, read_auth: dict[str, str], cursor: str
) -> None:
    body = assert_error(
        client.get(f"/hosts?cursor={cursor}", headers=read_auth), 422, "invalid_cursor"
    )
    assert body["detail"] == {"cursor": cursor}


def test_list_hosts__only_issued_cursors_are_accepted(
    client: TestClient, read_auth: dict[str, str], fleet: dict[str, Host]
) -> None:
    first = client.get("/hosts?limit=1", headers=read_auth).json()
    assert client.get(f"/hosts?cursor={first['next']}", headers=read_auth).status_code == 200
    # hand-made: the old unsigned form, a zero-padded id, another endpoint's cursor
    host_id = fleet["a-overdue"].pk
    for made in (
        "h1." + b64(str(host_id)),
        "h1." + b64(f"{host_id:04d}"),
        encode_cursor(host_id),
        "h1." + b64(str(host_id)) + encode_cursor(host_id)[-44:],  # its signature, here
    ):
        response = client.get(f"/hosts?cursor={made}", headers=read_auth)
        assert_error(response, 422, "invalid_cursor")


@pytest.mark.parametrize("query", ["limit=0", "limit=501", "cursor=", "overdue=maybe"])
def test_list_hosts__bad_query_is_422(
    client: TestClient, read_auth: dict[str, str], query: str
) -> None:
    body = assert_error(client.get(f"/hosts?{query}", headers=read_auth), 422, "validation_error")
    assert body["detail"]["errors"][0]["loc"][0] == "query"


def test_list_hosts__constant_queries(
    client: TestClient, clock: FakeClock, django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    user = make_user("viewer", perms=["view_host"])
    assert user.has_perm("durable_agent.view_host")  # loads the user's permission cache
    for _n in range(3):
        host = HostFactory()
        DueLaneFactory(host=host, state="parked")
        RecoveryFaultFactory(host=host)
        BindingRetryFactory(host=host)
    with django_assert_num_queries(1):  # the page alone, whatever the number of hosts
        assert len(client.get("/hosts", user=user).json()["items"]) == 3
    HostFactory.create_batch(5)
    with django_assert_num_queries(1):
        assert len(client.get("/hosts", user=user).json()["items"]) == 8


def test_get_host__everything_the_host_page_shows(
    client: TestClient, host: Host, clock: FakeClock, read_auth: dict[str, str]
) -> None:
    MaintenanceStateFactory(host=host, dirty=4, processed=2, nonterminal=1)
    DueLaneFactory(host=host, lane="outbox", state="parked", stalls=8, due_at=None, revision=9)
    retry = BindingRetryFactory(host=host, thread="t1", submission="s1", registry_key="r0")
    RecoveryFaultFactory(host=host, thread="t2")
    for minute in range(12):
        PassRecordFactory(host=host, started_at=T0 + timedelta(minutes=minute))

    body = client.get(f"/hosts/{host.key}", headers=read_auth).json()

    assert (body["key"], body["alarm"], body["overdue"]) == (host.key, None, False)
    assert body["state"]["dirty"] == 4
    assert body["state"]["processed"] == 2
    assert body["invariant"]["ok"] is False  # dirty without an alarm
    assert body["invariant"]["violations"][0] == "owed work without an armed alarm"
    assert body["lanes"] == [
        {
            "lane": "outbox",
            "state": "parked",
            "due_at": None,
            "not_before": None,
            "stalls": 8,
            "revision": 9,
            "progress_key": None,
            "reported": False,
        }
    ]
    assert body["binding_retries"][0] == {
        "id": retry.pk,
        "thread": "t1",
        "submission": "s1",
        "attempts": 1,
        "reported_at": "2030-01-01T00:00:00Z",
        "registry_key": "r0",
    }
    assert [fault["thread"] for fault in body["faults"]] == ["t2"]
    assert len(body["recent_passes"]) == 10
    assert body["recent_passes"][0]["started_at"] == "2030-01-01T00:11:00Z"


def test_get_host__without_a_state_row_reads_one_dirty_generation(
    client: TestClient, host: Host, read_auth: dict[str, str]
) -> None:
    state = client.get(f"/hosts/{host.key}", headers=read_auth).json()["state"]
    assert (state["dirty"], state["processed"], state["pass_lease_owner"]) == (1, 0, None)


@pytest.mark.parametrize("path", ["/hosts/nope", "/hosts/nope/lanes", "/hosts/nope/audit"])
def test_host_endpoints__unknown_host_is_404(
    client: TestClient, read_auth: dict[str, str], path: str
) -> None:
    body = assert_error(client.get(path, headers=read_auth), 404, "host_not_found")
    assert body["detail"] == {"host": "nope"}


def test_host_endpoints__a_key_that_is_not_a_slug_is_422(
    client: TestClient, read_auth: dict[str, str]
) -> None:
    assert_error(client.get("/hosts/a.b", headers=read_auth), 422, "validation_error")


def test_list_lanes__by_lane_id(client: TestClient, host: Host, read_auth: dict[str, str]) -> None:
    DueLaneFactory(host=host, lane="z-lane", state="idle", due_at=None)
    DueLaneFactory(host=host, lane="agent:native")
    response = client.get(f"/hosts/{host.key}/lanes", headers=read_auth)
    assert [(lane["lane"], lane["state"]) for lane in response.json()] == [
        ("agent:native", "pending"),
        ("z-lane", "idle"),
    ]


def test_list_audit__newest_first_and_paged(
    client: TestClient, host: Host, read_auth: dict[str, str]
) -> None:
    for minute in range(3):
        AlarmAuditFactory(host=host, at=T0 + timedelta(minutes=minute), reason=f"r{minute}")
    AlarmAuditFactory(at=T0)  # another host's
    body = client.get(f"/hosts/{host.key}/audit?limit=2", headers=read_auth).json()
    assert body["count"] == 3
    assert [item["reason"] for item in body["items"]] == ["r2", "r1"]
    body = client.get(f"/hosts/{host.key}/audit?limit=2&offset=2", headers=read_auth).json()
    assert [item["reason"] for item in body["items"]] == ["r0"]


def test_health__the_invariant_audit(
    client: TestClient, fleet: dict[str, Host], read_auth: dict[str, str]
) -> None:
    body = client.get("/health", headers=read_auth).json()
    assert body["ok"] is True
    assert body["hosts"] == 4
    assert body["overdue"] == ["a-overdue"]
    assert body["parked"] == {"b-parked": ["outbox"]}
    assert body["violating"] == []


def test_health__reports_violating_hosts(
    client: TestClient, host: Host, clock: FakeClock, read_auth: dict[str, str]
) -> None:
    MaintenanceStateFactory(host=host, dirty=2, processed=1)
    body = client.get("/health", headers=read_auth).json()
    assert body["ok"] is False
    [violating] = body["violating"]
    assert (violating["host"], violating["ok"], violating["slot"]) == (host.key, False, None)
    assert violating["violations"] == ["owed work without an armed alarm"]


def add_unhealthy_hosts(first: int, count: int, started_at: Any) -> None:
    """``count`` hosts that are failing, violating the invariant and parked, with a long error
    (bulk-created: a few queries whatever ``count``)."""
    hosts = Host.objects.bulk_create(
        [Host(key=f"sick-{n:05d}") for n in range(first, first + count)]
    )
    MaintenanceState.objects.bulk_create(
        [MaintenanceState(host=host, dirty=2, processed=1) for host in hosts]
    )
    DueLane.objects.bulk_create(
        [
            DueLane(host=host, lane=f"lane-{n}", state="parked", stalls=8, due_at=None)
            for host in hosts
            for n in range(3)
        ]
    )
    PassRecord.objects.bulk_create(
        [
            PassRecord(host=host, started_at=started_at, phase="failed", error="E" * 5000)
            for host in hosts
            for _ in range(3)
        ]
    )


def test_health__is_bounded_however_many_hosts_are_unhealthy(
    client: TestClient, clock: FakeClock, read_auth: dict[str, str]
) -> None:
    add_unhealthy_hosts(0, HEALTH_LISTED + 10, clock.now())
    small = client.get("/health", headers=read_auth)
    add_unhealthy_hosts(HEALTH_LISTED + 10, 4 * HEALTH_LISTED, clock.now())
    large = client.get("/health", headers=read_auth)
    body = large.json()

    unhealthy = 5 * HEALTH_LISTED + 10
    assert body["ok"] is False
    assert body["listed"] == HEALTH_LISTED
    assert body["counts"] == {
        "violating": unhealthy,
        "failing": unhealthy,
        "overdue": 0,
        "parked_hosts": unhealthy,
        "parked_lanes": 3 * unhealthy,
        "stale_leases": 0,
    }
    first = [f"sick-{n:05d}" for n in range(HEALTH_LISTED)]
    assert [row["host"] for row in body["violating"]] == first
    assert [row["host"] for row in body["failing"]] == first
    assert list(body["parked"]) == first
    assert {len(row["error"]) for row in body["failing"]} == {HEALTH_ERROR_CHARS}
    assert body["failing"][0]["error"].endswith("…")
    assert {len(row["last_error"]) for row in body["violating"]} == {HEALTH_ERROR_CHARS}
    # the size no longer grows with the unhealthy hosts (only the counts' digits change)
    assert abs(len(large.content) - len(small.content)) < 50
    assert len(large.content) < 100_000


def test_health__its_queries_do_not_grow_with_the_unhealthy_hosts(
    client: TestClient, clock: FakeClock, read_auth: dict[str, str]
) -> None:
    """Counted in SQL, read in full only for the hosts it lists (Note [Counting the unhealthy
    hosts]): the same queries at 60 unhealthy hosts as at 1 260."""
    add_unhealthy_hosts(0, HEALTH_LISTED + 10, clock.now())
    client.get("/health", headers=read_auth)  # the token's first use is recorded once
    with CaptureQueriesContext(connection) as few:
        small = client.get("/health", headers=read_auth)
    add_unhealthy_hosts(HEALTH_LISTED + 10, 1200, clock.now())
    with CaptureQueriesContext(connection) as many:
        large = client.get("/health", headers=read_auth)

    assert large.json()["counts"]["failing"] == HEALTH_LISTED + 1210
    assert small.json()["failing"] == large.json()["failing"]
    assert len(many) == len(few)


def test_health__work_waiting_for_a_person_is_degraded_not_down(
    client: TestClient, host: Host, clock: FakeClock, read_auth: dict[str, str]
) -> None:
    thread = ThreadFactory(host=host, key="t")
    SubmissionFactory(thread=thread, sequence=1, state="unknown")
    body = client.get("/health", headers=read_auth).json()
    assert (body["ok"], body["degraded"]) == (True, True)
    assert body["attention"] == {
        "unknown": 1,
        "suspended": 0,
        "binding_waits": 0,
        "failing_hosts": 0,
        "total": 1,
    }
