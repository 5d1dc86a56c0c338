"""Several clusters on one database: losing one leaves the others firing every alarm.

Every ``AlarmBroker`` probes and listens on its own (there is no elected prober to lose, see
docs/deployment.md "Several clusters"): this kills one of two live clusters with SIGKILL, its
whole process group at once, as a machine that dies would, and shows that alarms armed before
and after the death all fire on the survivor, each host's pass once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from durable_agent.maintenance import alarm, gate
from durable_agent.maintenance.lane_ids import LIFECYCLE
from durable_agent.models import Host, PassRecord
from tests.maintenance.helpers import caught_up
from tests.procs import ROOT, database_url, listeners

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

HOSTS = 8


def _cluster() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url(), "Q_WORKERS": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, killed as one
    )


def _await(predicate: object, timeout: float) -> bool:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)  # polling an observable condition
    return bool(predicate())  # type: ignore[operator]


def _arm(prefix: str) -> list[Host]:
    hosts = []
    deadline = timezone.now() + timedelta(seconds=1)
    for i in range(HOSTS):
        host = Host.objects.create(key=f"{prefix}-{i}")
        caught_up(host)
        gate.schedule(host, LIFECYCLE, deadline)
        hosts.append(host)
    return hosts


def _ran(hosts: list[Host]) -> dict[int, int]:
    """Passes that ran work (not busy or stale deliveries), per host id."""
    counts = {host.pk: 0 for host in hosts}
    rows = PassRecord.objects.filter(host__in=hosts, deadline__isnull=False).exclude(
        phase__in=["busy", "stale"]
    )
    for host_id in rows.values_list("host_id", flat=True):
        counts[host_id] += 1
    return counts


def _stop(cluster: subprocess.Popen[str]) -> str:
    if cluster.poll() is None:
        cluster.send_signal(signal.SIGTERM)
    try:
        output, _ = cluster.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(cluster.pid, signal.SIGKILL)
        output, _ = cluster.communicate()
    return output


def test_failover__alarms_keep_firing_after_one_of_two_clusters_is_killed() -> None:
    first, second = _cluster(), _cluster()
    outputs = ["", ""]
    try:
        assert _await(lambda: listeners() == 2, 60), "both clusters should LISTEN"
        before = _arm("before")
        assert _await(lambda: all(n >= 1 for n in _ran(before).values()), 30), _ran(before)

        os.killpg(first.pid, signal.SIGKILL)  # the whole machine, at once
        first.wait(timeout=30)
        assert _await(lambda: listeners() == 1, 30), "the dead cluster's listener stays"

        after = _arm("after")
        assert _await(lambda: all(n >= 1 for n in _ran(after).values()), 30), _ran(after)
        assert second.poll() is None, "the surviving cluster exited"
    finally:
        outputs = [_stop(first), _stop(second)]
    context = f"survivor's output:\n{outputs[1]}"
    assert all(n == 1 for n in _ran(before).values()), (_ran(before), context)
    assert all(n == 1 for n in _ran(after).values()), (_ran(after), context)
    assert all(alarm.scheduled(host) is None for host in before + after), context
    assert second.returncode == 0, context
