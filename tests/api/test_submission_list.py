"""GET submissions: filters, keyset pagination, permissions; the submit scope."""

from __future__ import annotations

from typing import Any

import pytest
from ninja.testing import TestClient

from durable_agent.api.submissions import encode_cursor
from durable_agent.api.tokens import issue_token
from durable_agent.models import Host, Submission, SubmissionOutcome, SubmissionState, Thread
from tests.api.conftest import assert_error, bearer, make_user
from tests.factories import T0, HostFactory, SubmissionFactory

pytestmark = pytest.mark.django_db


def add(host: Host, thread: str, state: SubmissionState, agent: str = "echo") -> Submission:
    row, _ = Thread.objects.get_or_create(host=host, key=thread, defaults={"created_at": T0})
    sequence = Submission.objects.filter(thread=row).count() + 1
    fields: dict[str, Any] = {}
    if state == SubmissionState.SETTLED:
        fields = {"outcome": SubmissionOutcome.COMPLETED, "settled_at": T0}
    if state == SubmissionState.SUSPENDED:
        fields = {"approval_reason": "ok?"}
    submission: Submission = SubmissionFactory(
        thread=row, sequence=sequence, state=state, agent=agent, **fields
    )
    return submission


@pytest.fixture
def fleet(host: Host) -> dict[str, Submission]:
    other = HostFactory(key="other")
    return {
        "a1": add(host, "a", SubmissionState.SETTLED),
        "a2": add(host, "a", SubmissionState.SUSPENDED),
        "b1": add(host, "b", SubmissionState.UNKNOWN, agent="pay"),
        "o1": add(other, "a", SubmissionState.READY),
        "o2": add(other, "c", SubmissionState.SUSPENDED, agent="pay"),
    }


def ids(response: Any) -> list[int]:
    assert response.status_code == 200, response.json()
    return [item["id"] for item in response.json()["items"]]


def test_list__newest_first_with_each_filter(
    client: TestClient, host: Host, fleet: dict[str, Submission], read_auth: dict[str, str]
) -> None:
    f = {name: row.pk for name, row in fleet.items()}
    get = lambda query: client.get(f"/submissions{query}", headers=read_auth)  # noqa: E731
    assert ids(get("")) == [f["o2"], f["o1"], f["b1"], f["a2"], f["a1"]]
    assert ids(get(f"?host={host.key}")) == [f["b1"], f["a2"], f["a1"]]
    assert ids(get("?thread=a")) == [f["o1"], f["a2"], f["a1"]]
    assert ids(get("?state=suspended")) == [f["o2"], f["a2"]]
    assert ids(get("?agent=pay")) == [f["o2"], f["b1"]]
    assert ids(get(f"?host={host.key}&thread=a&state=suspended")) == [f["a2"]]
    item = get(f"?state=unknown&host={host.key}").json()["items"][0]
    assert (item["host"], item["thread"], item["sequence"], item["agent"]) == (
        host.key,
        "b",
        1,
        "pay",
    )
    assert "payload" not in item


def test_list__pages_follow_next_without_skipping_or_repeating(
    client: TestClient, host: Host, read_auth: dict[str, str]
) -> None:
    rows = [add(host, f"t{n}", SubmissionState.READY).pk for n in range(7)]
    seen: list[int] = []
    query = "?limit=3"
    pages = 0
    while True:
        body = client.get(f"/submissions{query}", headers=read_auth).json()
        seen += [item["id"] for item in body["items"]]
        pages += 1
        if pages == 1:  # new work arriving while a client pages does not shift the pages
            add(host, "late", SubmissionState.READY)
        if body["next"] is None:
            break
        query = f"?limit=3&cursor={body['next']}"
    assert seen == sorted(rows, reverse=True)
    assert pages == 3


def test_list__limit_and_cursor_are_validated(
    client: TestClient, host: Host, read_auth: dict[str, str]
) -> None:
    assert_error(client.get("/submissions?limit=501", headers=read_auth), 422, "validation_error")
    assert_error(client.get("/submissions?limit=0", headers=read_auth), 422, "validation_error")
    for cursor in ("12", "s1.!!", "s1.", "s1.LTE", encode_cursor(5)[:-1] + "*"):
        response = client.get(f"/submissions?cursor={cursor}", headers=read_auth)
        assert_error(response, 422, "invalid_cursor")
    assert ids(client.get(f"/submissions?cursor={encode_cursor(1)}", headers=read_auth)) == []
    assert_error(client.get("/submissions?host=nope", headers=read_auth), 404, "host_not_found")
    assert_error(client.get("/submissions?state=done", headers=read_auth), 422, "validation_error")


def test_list__sessions_need_a_submission_permission(
    client: TestClient, host: Host, fleet: dict[str, Submission]
) -> None:
    viewer = make_user("hosts-only", perms=["view_host"])
    assert_error(client.get("/submissions", user=viewer), 403, "insufficient_scope")
    reader = make_user("ledger", perms=["view_submission"])
    assert len(ids(client.get("/submissions", user=reader))) == 5


# -- the submit scope ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "submit", "repair", "read"),
    [("read", 403, 403, 200), ("submit", 201, 403, 403), ("repair", 201, 200, 200)],
)
def test_scopes__submit_is_separate_from_repair(
    client: TestClient,
    host: Host,
    echo: Any,
    clock: Any,
    scope: str,
    submit: int,
    repair: int,
    read: int,
) -> None:
    headers = bearer(issue_token(name="producer", scope=scope).secret)
    response = client.post(
        f"/hosts/{host.key}/threads/t/submissions",
        json={"agent": "echo", "payload": 1},
        headers=headers,
    )
    assert response.status_code == submit, response.json()
    suspended = add(host, "s", SubmissionState.SUSPENDED)
    assert (
        client.post(f"/submissions/{suspended.pk}/approve", json={}, headers=headers).status_code
        == repair
    )
    assert (
        client.post(f"/hosts/{host.key}/rearm", json={"reason": "x"}, headers=headers).status_code
        == repair
    )
    assert client.get("/submissions", headers=headers).status_code == read
    assert client.get(f"/submissions/{suspended.pk}", headers=headers).status_code == read
    assert client.get("/hosts", headers=headers).status_code == 200
    assert client.get(f"/hosts/{host.key}", headers=headers).status_code == 200


def test_scopes__a_submit_token_reads_no_payload(
    client: TestClient, host: Host, echo: Any, clock: Any
) -> None:
    other = add(host, "private", SubmissionState.READY)
    other.payload = {"card": "4111 1111 1111 1111"}
    other.save()
    headers = bearer(issue_token(name="producer", scope="submit").secret)
    receipt = client.post(
        f"/hosts/{host.key}/threads/mine/submissions",
        json={"agent": "echo", "payload": {"mine": 1}},
        headers=headers,
    )
    assert receipt.status_code == 201
    assert "payload" not in receipt.json()
    for path in ("/submissions", f"/submissions/{other.pk}", f"/submissions?host={host.key}"):
        response = client.get(path, headers=headers)
        body = assert_error(response, 403, "insufficient_scope")
        assert "4111" not in response.content.decode()
        assert "read or repair scope" in body["message"]
