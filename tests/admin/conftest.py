from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.admin.browser import skipped

    if skipped:
        terminalreporter.write_line(
            f"WARNING: {len(skipped)} admin browser tests were SKIPPED: {skipped[0]}",
            red=True,
            bold=True,
        )


def _staff(username: str, *, repair: bool) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="durable_agent", codename__startswith="view_"
    )
    user.user_permissions.add(*perms)
    if repair:
        user.user_permissions.add(Permission.objects.get(codename="repair_host"))
    return user


@pytest.fixture
def viewer(db: None) -> User:
    """Staff who may view every durable_agent page, but not repair."""
    return _staff("viewer", repair=False)


@pytest.fixture
def operator(db: None) -> User:
    """Staff who may view every page and run the repairs."""
    return _staff("operator", repair=True)


@pytest.fixture
def viewer_client(viewer: User) -> Client:
    client = Client()
    client.force_login(viewer)
    return client


@pytest.fixture
def operator_client(operator: User) -> Client:
    client = Client()
    client.force_login(operator)
    return client
