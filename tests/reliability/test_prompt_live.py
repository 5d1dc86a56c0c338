"""Prompt start on live clusters (Note [Prompt start] in durable_agent/maintenance/passes/run.py).

- With the hint, the pass that runs a fresh submission is a prompt pass (a ``PassRecord``
  without a deadline), with two clusters exactly one per host: the lease decides.
- Without it, each way the hint can be lost (the broker ignores it, the listener is down, no
  cluster ran when it was sent) leaves the slot, which fires the pass (a ``PassRecord`` with the
  slot's deadline).

The producers here arm the backstop 1 s ahead (``ALARM_BACKOFF_BASE_MS`` 2000, so a minimum
delay of 1 s), so that a prompt pass is told apart from the slot by its record, not by timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.test import override_settings

import durable_agent
from durable_agent.models import Host, PassRecord, Submission
from tests.procs import ROOT, database_url, listeners

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SLOW_BACKSTOP = {"ALARM_BACKOFF_BASE_MS": 2000}  # the minimum alarm delay: 1 s


@contextmanager
def clusters(tmp_path: Path, count: int = 1, **env: str) -> Iterator[list[Path]]:
    """``count`` live clusters (one worker each), started and listening; stopped after."""
    logs = [tmp_path / f"qcluster-{i}.log" for i in range(count)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for log in logs:
            with log.open("w") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "manage.py", "qcluster"],
                        cwd=ROOT,
                        env={
                            **os.environ,
                            "DATABASE_URL": database_url(),
                            "Q_WORKERS": "1",
                            **env,
                        },
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        give_up = time.monotonic() + 60
        while not all("] running." in log.read_text() for log in logs):
            assert all(p.poll() is None for p in procs), _tail(logs)
            assert time.monotonic() < give_up, _tail(logs)
            time.sleep(0.1)  # polling an observable condition
        if env.get("Q_BROKER_CLASS") != "tests.brokers.NoListenAlarmBroker":
            while listeners() < count:
                assert time.monotonic() < give_up, _tail(logs)
                time.sleep(0.1)  # polling an observable condition
        yield logs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def _tail(logs: list[Path]) -> str:
    return "\n".join(log.read_text()[-2000:] for log in logs)


def submit_all(hosts: list[Host], threads: int = 1) -> list[int]:
    ids = []
    with override_settings(DURABLE_AGENT=SLOW_BACKSTOP):
        for i, host in enumerate(hosts):
            for t in range(threads):
                receipt = durable_agent.submit(
                    host=host, thread=f"t{t}", agent="summarise", payload={"text": f"n {i}"}
                )
                ids.append(receipt.submission_id)
    return ids


def settle(ids: list[int], logs: list[Path], timeout: float = 60) -> None:
    give_up = time.monotonic() + timeout
    rows = Submission.objects.filter(pk__in=ids)
    while rows.exclude(state="settled").exists():
        assert time.monotonic() < give_up, _tail(logs)
        time.sleep(0.1)  # polling an observable condition
    assert set(rows.values_list("outcome", flat=True)) == {"completed"}
    assert set(rows.values_list("attempts", flat=True)) == {1}  # every agent ran once


def make_hosts(prefix: str, count: int) -> list[Host]:
    return [Host.objects.create(key=f"{prefix}-{i}") for i in range(count)]


def passes_by_kind(hosts: list[Host]) -> tuple[dict[int, int], dict[int, int]]:
    """Per host: the prompt passes that ran work, and the slot's passes that ran work."""
    prompt: dict[int, int] = {h.pk: 0 for h in hosts}
    slot: dict[int, int] = {h.pk: 0 for h in hosts}
    for host_id, deadline in PassRecord.objects.filter(
        host__in=hosts, phase="actionable"
    ).values_list("host_id", "deadline"):
        (prompt if deadline is None else slot)[host_id] += 1
    return prompt, slot


def test_prompt_live__two_clusters_one_prompt_pass_per_host(tmp_path: Path) -> None:
    hosts = make_hosts("two", 12)
    shared = make_hosts("shared", 1)
    with clusters(tmp_path, count=2) as logs:
        ids = submit_all(hosts) + submit_all(shared, threads=6)
        settle(ids, logs)
        time.sleep(0.5)  # a late duplicate would have recorded itself by now

    prompt, slot = passes_by_kind(hosts)
    assert prompt == {h.pk: 1 for h in hosts}, _tail(logs)  # the lease decided: one pass
    assert slot == {h.pk: 0 for h in hosts}, _tail(logs)  # the backstop never had to fire
    assert "ERROR" not in _tail(logs)


@pytest.mark.parametrize(
    "broker",
    ["tests.brokers.NoPromptAlarmBroker", "tests.brokers.NoListenAlarmBroker"],
    ids=["hint-lost", "listener-down"],
)
def test_prompt_live__a_lost_hint_leaves_the_slot_to_fire(tmp_path: Path, broker: str) -> None:
    hosts = make_hosts("lost", 3)
    with clusters(tmp_path, Q_BROKER_CLASS=broker) as logs:
        ids = submit_all(hosts)
        settle(ids, logs)

    prompt, slot = passes_by_kind(hosts)
    assert prompt == {h.pk: 0 for h in hosts}, _tail(logs)
    assert slot == {h.pk: 1 for h in hosts}, _tail(logs)


def test_prompt_live__work_sent_while_no_cluster_runs_is_fired_by_its_slot(
    tmp_path: Path,
) -> None:
    hosts = make_hosts("restart", 3)
    ids = submit_all(hosts)  # the hints go to nobody
    with clusters(tmp_path) as logs:
        settle(ids, logs)

    prompt, slot = passes_by_kind(hosts)
    assert prompt == {h.pk: 0 for h in hosts}, _tail(logs)
    assert slot == {h.pk: 1 for h in hosts}, _tail(logs)
