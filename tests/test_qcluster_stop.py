"""Stopping a live qcluster the ways docs/deployment.md's units do: it exits within 10 s and
loses no work.

``leader`` is SIGTERM to the main process alone (systemd ``KillMode=mixed``, supervisor's
default, a container whose entry point ``exec``s qcluster); ``group`` is SIGTERM to every
process of the cluster at once (systemd's default ``KillMode=control-group``, ``kill --
-PGID``), which used to leave the cluster hanging in "stopping" (Note [SIGTERM to the group]
in durable_agent/broker.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import durable_agent
from durable_agent.maintenance.operators.audit import audit_all
from durable_agent.models import Host, Submission
from durable_agent.runtime import get_runtime
from tests.procs import ROOT, database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

STOP_LIMIT_S = 10.0


def _start_cluster(log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": database_url(), "Q_WORKERS": "2"}
    with log.open("w") as out:
        cluster = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as under a service manager
        )
    give_up = time.monotonic() + 60
    while "] running." not in log.read_text():
        assert cluster.poll() is None, log.read_text()
        assert time.monotonic() < give_up, log.read_text()
        time.sleep(0.1)  # polling an observable condition
    return cluster


def _submit(host: Host, n: int, start: int) -> None:
    for i in range(start, start + n):
        durable_agent.submit(
            host=host, thread=f"t{i % 3}", agent="summarise", payload={"text": f"words {i}"}
        )


@pytest.mark.parametrize("how", ["leader", "group"])
def test_qcluster__stops_within_10_s_and_loses_no_work(how: str, tmp_path: Path) -> None:
    host = Host.objects.create(key="stopping")
    log = tmp_path / "qcluster.log"
    cluster = _start_cluster(log)
    try:
        _submit(host, 6, 0)
        give_up = time.monotonic() + 30
        while Submission.objects.exclude(state="settled").exists():
            assert time.monotonic() < give_up, log.read_text()
            time.sleep(0.05)  # polling an observable condition
        # Then stop while more alarm tasks are queued than the cluster holds (queue_limit 4,
        # bulk 4, 2 workers): a worker that died on the signal would leave the pusher blocked
        # on the full task queue.
        for n in range(10):
            _submit(Host.objects.create(key=f"busy-{n}"), 2, 100 + 2 * n)
        stopped_at = time.monotonic()
        if how == "group":
            os.killpg(cluster.pid, signal.SIGTERM)
        else:
            cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(timeout=STOP_LIMIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"qcluster still running {STOP_LIMIT_S} s after SIGTERM:\n{log.read_text()}"
            )
        elapsed = time.monotonic() - stopped_at
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait()
        else:
            # Reap anything left in its group (nothing, when it stopped cleanly).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(cluster.pid, signal.SIGKILL)
    assert cluster.returncode == 0, log.read_text()
    assert elapsed < STOP_LIMIT_S
    assert "has stopped" in log.read_text()
    # No work lost: every submission is settled, or still owed with its host's alarm armed.
    summary = audit_all(registry_key=get_runtime().binding_registry_key())
    assert summary.ok, [h.host for h in summary.violating]
    assert Submission.objects.count() == 26
