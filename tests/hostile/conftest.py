from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from ninja.testing import TestClient

from durable_agent.agents import registry
from durable_agent.api import router
from durable_agent.api.tokens import issue_token
from tests.hostile import cases


@pytest.fixture
def runs_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file every hostile agent and lane appends ``run <name>`` to."""
    path = tmp_path / "runs"
    monkeypatch.setenv(cases.RUNS_ENV, str(path))
    return path


@pytest.fixture(autouse=True)
def hostile_cases() -> Iterator[None]:
    """Every case's agent and lane registered (the lanes are restored by tests/conftest.py)."""
    saved = registry.snapshot()
    registry.restore({})
    cases.register()
    yield
    registry.restore(saved)


@pytest.fixture
def operator() -> Client:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="durable_agent"))
    client = Client(raise_request_exception=True)
    client.force_login(User.objects.get(pk=user.pk))
    return client


@pytest.fixture
def api(db: None) -> tuple[TestClient, dict[str, str]]:
    secret = issue_token(name="ops", scope="repair").secret
    return TestClient(router), {"Authorization": f"Bearer {secret}"}
