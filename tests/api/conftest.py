from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from ninja.testing import TestClient

from durable_agent.agents import registry
from durable_agent.api import router
from durable_agent.api.tokens import issue_token

REPAIR_PERMISSION = ("durable_agent", "repair_host")


@pytest.fixture(autouse=True)
def _empty_agent_registry() -> Iterator[None]:
    """Every test starts with no agents registered and leaves the registry as it found it."""
    saved = registry.snapshot()
    registry.restore({})
    yield
    registry.restore(saved)


@pytest.fixture(autouse=True)
def _no_failure_counts() -> Iterator[None]:
    """Refused-token counts (kept in Django's cache, durable_agent/api/failures.py) do not
    carry over from one test to the next: every test runs at the same fake minute."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    """make_user hashes a password; the default hasher takes most of a second per user."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def echo() -> Callable[..., Any]:
    """The agent ``echo`` v1: returns its payload."""

    @registry.agent("echo", version="1")
    def echo(ctx: Any, payload: Any) -> Any:
        return payload

    return echo


@pytest.fixture
def client() -> TestClient:
    """ninja's TestClient on the Router alone (no project URLs, no CSRF)."""
    return TestClient(router)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def read_auth(db: None, clock: Any) -> dict[str, str]:
    """Headers with a read-scope token called ``reader``."""
    return bearer(issue_token(name="reader", scope="read").secret)


@pytest.fixture
def repair_auth(db: None, clock: Any) -> dict[str, str]:
    """Headers with a repair-scope token called ``ops``."""
    return bearer(issue_token(name="ops", scope="repair").secret)


def make_user(
    username: str, *, staff: bool = True, repair: bool = False, perms: Iterable[str] = ()
) -> User:
    """A user with ``durable_agent`` permissions: ``repair_host`` when ``repair``, and each
    codename of ``perms`` (``"view_host"``, ``"view_submission"``...)."""
    user = User.objects.create_user(username, password="pw", is_staff=staff)
    codenames = [*perms, REPAIR_PERMISSION[1]] if repair else list(perms)
    if codenames:
        user.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="durable_agent", codename__in=codenames
            )
        )
        assert user.user_permissions.count() == len(set(codenames)), codenames
        user = User.objects.get(pk=user.pk)  # drop the permission cache
    return user


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The response is the error contract's body with ``status`` and ``code``."""
    body: dict[str, Any] = response.json()
    assert response.status_code == status, body
    assert set(body) == {"code", "message", "detail"}, body
    assert body["code"] == code, body
    assert isinstance(body["message"], str)
    assert body["message"]
    assert isinstance(body["detail"], dict)
    return body
