"""A live cluster on PostgreSQL starts a delayed submission at its time, never sooner, and
``durable_agent.wait`` (woken by the settlement notification) returns it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

import durable_agent
from durable_agent.errors import WaitTimeout
from durable_agent.models import Host
from tests.procs import ROOT, database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_live__a_delayed_submission_starts_at_its_time(tmp_path: Path) -> None:
    host = Host.objects.create(key="delayed")
    log = tmp_path / "qcluster.log"
    env = {**os.environ, "DATABASE_URL": database_url(), "Q_WORKERS": "1"}
    with log.open("w") as out:
        cluster = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        give_up = time.monotonic() + 60
        while "] running." not in log.read_text():
            assert cluster.poll() is None, log.read_text()
            assert time.monotonic() < give_up, log.read_text()
            time.sleep(0.1)  # polling an observable condition
        receipt = durable_agent.submit(
            host=host,
            thread="t",
            agent="summarise",
            payload={"text": "later on"},
            not_before=timedelta(seconds=2),
        )
        with pytest.raises(WaitTimeout):
            durable_agent.wait(receipt, timeout=1)  # still waiting for its time

        row = durable_agent.wait(receipt, timeout=30)

        assert (row.outcome, row.result) == ("completed", {"words": 2, "summary": "later on"})
        assert row.not_before is not None
        assert row.settled_at is not None
        assert row.settled_at >= row.not_before  # never sooner
        assert row.settled_at - row.not_before < timedelta(seconds=2), log.read_text()[-3000:]
    finally:
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(timeout=30)
        finally:
            if cluster.poll() is None:
                os.killpg(cluster.pid, signal.SIGKILL)
                cluster.wait()
