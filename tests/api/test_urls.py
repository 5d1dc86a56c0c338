"""The API through Django's test client and project/urls.py (middleware, CSRF, URL decoding)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client
from django.utils.crypto import get_random_string

from durable_agent.models import AlarmAudit, Host
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.api.conftest import assert_error, make_user
from tests.factories import RecoveryFaultFactory
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db

BASE = "/api/durable-agent"


def bearer(headers: dict[str, str]) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": headers["Authorization"]}


def test_urls__smoke(
    host: Host, read_auth: dict[str, str], repair_auth: dict[str, str], clock: FakeClock
) -> None:
    web = Client()
    # unauthenticated
    assert_error(web.get(f"{BASE}/hosts"), 401, "not_authenticated")
    # a read-only token on a repair
    response = web.post(
        f"{BASE}/hosts/{host.key}/rearm",
        data={"reason": "x"},
        content_type="application/json",
        **bearer(read_auth),
    )
    assert_error(response, 403, "insufficient_scope")
    # an unknown host
    assert_error(web.get(f"{BASE}/hosts/nope", **bearer(read_auth)), 404, "host_not_found")
    # an invalid lane id, and an invalid reason
    response = web.post(
        f"{BASE}/hosts/{host.key}/lanes/bad%20lane/unpark",
        content_type="application/json",
        **bearer(repair_auth),
    )
    assert_error(response, 422, "validation_error")
    response = web.post(
        f"{BASE}/hosts/{host.key}/rearm",
        data={"reason": ""},
        content_type="application/json",
        **bearer(repair_auth),
    )
    assert_error(response, 422, "validation_error")
    # rearm into a disarmed host
    assert host.alarm is None
    response = web.post(
        f"{BASE}/hosts/{host.key}/rearm",
        data={"reason": "smoke"},
        content_type="application/json",
        **bearer(repair_auth),
    )
    assert response.status_code == 200
    assert response.json()["alarm"] == "2030-01-01T00:00:00.050Z"
    audit = AlarmAudit.objects.get(host=host)
    assert (audit.action, audit.actor, audit.reason) == ("rearm", "token:ops", "smoke")


def test_urls__staff_session_posts_need_the_csrf_token(host: Host, clock: FakeClock) -> None:
    make_user("operator", repair=True, perms=["view_host"])
    web = Client(enforce_csrf_checks=True)
    assert web.login(username="operator", password="pw")
    path = f"{BASE}/hosts/{host.key}/rearm"
    assert web.get(f"{BASE}/hosts").status_code == 200  # safe methods need no token

    response = web.post(path, data={"reason": "x"}, content_type="application/json")
    assert_error(response, 403, "csrf_failed")
    assert not AlarmAudit.objects.exists()

    token = get_random_string(32)  # what a page with {% csrf_token %} would have set
    web.cookies[settings.CSRF_COOKIE_NAME] = token
    response = web.post(
        path, data={"reason": "x"}, content_type="application/json", HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 200
    assert AlarmAudit.objects.get().actor == "operator"


def test_urls__tokens_need_no_csrf_token(host: Host, repair_auth: dict[str, str]) -> None:
    web = Client(enforce_csrf_checks=True)
    response = web.post(
        f"{BASE}/hosts/{host.key}/rearm",
        data={"reason": "x"},
        content_type="application/json",
        **bearer(repair_auth),
    )
    assert response.status_code == 200


@pytest.mark.parametrize(("thread", "in_url"), [("tenant/7", "tenant%2F7"), ("a\nb", "a%0Ab")])
def test_urls__thread_keys_with_slashes_and_line_breaks(
    host: Host, runtime: ScriptedRuntime, repair_auth: dict[str, str], thread: str, in_url: str
) -> None:
    caught_up(host)
    RecoveryFaultFactory(host=host, thread=thread)
    response = Client().post(
        f"{BASE}/hosts/{host.key}/faults/{in_url}/retry",
        content_type="application/json",
        **bearer(repair_auth),
    )
    assert response.status_code == 200, response.content
    assert response.json()["action"] == "retry-fault"


def test_urls__docs_and_schema_are_served(db: None) -> None:
    web = Client()
    assert web.get(f"{BASE}/docs").status_code == 200
    schema = web.get(f"{BASE}/openapi.json").json()
    assert f"{BASE}/hosts/{{key}}/rearm" in schema["paths"]


def test_urls__unknown_paths_stay_django_404s(db: None) -> None:
    assert Client().get(f"{BASE}/nowhere").status_code == 404
