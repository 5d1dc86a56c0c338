"""Note [Prompt hint]: a commit that leaves work due now notifies the prompt channel, in its
own transaction (delivered at the commit, dropped with a rollback); nothing else does."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from durable_agent.alarm_listener import AlarmListener
from durable_agent.errors import AlarmError
from durable_agent.maintenance import failpoints, gate
from durable_agent.maintenance.lane_ids import LIFECYCLE, NATIVE
from durable_agent.maintenance.mutations import commit_function
from durable_agent.models import Host
from tests.maintenance.helpers import caught_up

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def listener() -> Iterator[AlarmListener]:
    listening = AlarmListener("default")
    listening.wait(0.0)  # connects and LISTENs
    try:
        yield listening
    finally:
        listening.close()


@pytest.fixture
def host() -> Host:
    created = Host.objects.create(key="hinted")
    caught_up(created)
    return created


def hinted(listener: AlarmListener, wait: float = 0.3) -> list[int]:
    """The hosts of every prompt hint delivered so far (waiting ``wait`` for the first)."""
    hosts: list[int] = []
    wakes = listener.wait(wait)
    while wakes:
        hosts += [w.host for w in wakes if w.host is not None]
        wakes = listener.wait(0.05)
    return hosts


def test_prompt_hint__progress_committed_hints_the_host_once(
    listener: AlarmListener, host: Host
) -> None:
    with gate.transaction(host) as tx:
        tx.record_progress([NATIVE])

    assert hinted(listener) == [host.pk]


@pytest.mark.parametrize("server", [True, False], ids=["commit-function", "python-path"])
def test_prompt_hint__both_commit_paths_hint(
    listener: AlarmListener, host: Host, server: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commit_function, "enabled", server)
    with gate.transaction(host) as tx:
        tx.record_progress([LIFECYCLE])
        tx.schedule(LIFECYCLE, timezone.now())

    assert hinted(listener) == [host.pk]


def test_prompt_hint__a_rolled_back_transaction_hints_nothing(
    listener: AlarmListener, host: Host
) -> None:
    """The commit function ran (and sent the hint) when the flush fails: all rolls back."""
    with (
        failpoints.installed(failpoints.raise_at("maintenance:queue:flush")),
        pytest.raises(AlarmError),
        gate.transaction(host) as tx,
    ):
        tx.record_progress([NATIVE])

    assert hinted(listener) == []


def test_prompt_hint__a_schedule_for_now_hints_one_for_later_does_not(
    listener: AlarmListener, host: Host
) -> None:
    gate.schedule(host, LIFECYCLE, timezone.now() + timedelta(seconds=5))
    assert hinted(listener) == []

    gate.schedule(host, LIFECYCLE, timezone.now())
    assert hinted(listener) == [host.pk]


def test_prompt_hint__maintenance_s_own_writes_hint_nothing(
    listener: AlarmListener, host: Host
) -> None:
    with gate.native_source(), gate.transaction(host) as tx:
        tx.record_progress([NATIVE])

    assert hinted(listener) == []


def test_prompt_hint__names_the_alarm_cluster(listener: AlarmListener, host: Host) -> None:
    with override_settings(DURABLE_AGENT={"ALARM_CLUSTER": "east"}):
        with gate.transaction(host) as tx:
            tx.record_progress([NATIVE])

    wakes = listener.wait(0.3)
    while True:
        more = listener.wait(0.05)
        if not more:
            break
        wakes += more
    assert [(w.cluster, w.host) for w in wakes if w.host is not None] == [("east", host.pk)]


def test_prompt_hint__progress_due_later_hints_nothing(listener: AlarmListener, host: Host) -> None:
    """A delayed submission's progress: its slot is armed for its time, nobody is woken now."""
    with gate.transaction(host) as tx:
        tx.record_progress([NATIVE], due_at=timezone.now() + timedelta(seconds=5))

    assert hinted(listener) == []
