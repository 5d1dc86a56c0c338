"""The hostile cases (tests/hostile/cases.py) through a live ``qcluster``, on PostgreSQL.

Every agent case is submitted and every lane case scheduled at once; a real cluster (its
``AlarmBroker``, its worker processes, django-q's worker and monitor, which format and store a
failed task's result) fires the hosts' alarms. Its agents' leases last 2 s
(tests/hostile/settings.py), so an attempt that failed to settle would run again within
seconds. Then, with the cluster stopped, every surface is read as in tests/hostile/test_hostile.py.

Checked: each agent ran exactly once and settled (or suspended) once with its storable error;
each lane ran once per pass, every pass left its ``PassRecord`` and its host turned failing;
no worker died (no reincarnation), every failed task's result was stored, and the cluster
exited cleanly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django_q.models import Task
from ninja.testing import TestClient

import durable_agent
from durable_agent import conf
from durable_agent.maintenance import gate
from durable_agent.models import Host, PassRecord, Submission
from durable_agent.text import unstorable
from tests.hostile.cases import CASES, runs
from tests.hostile.test_hostile import command_json, shown
from tests.procs import ROOT, database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LEASE_TTL_S = 2.0  # tests/hostile/settings.py
BUDGET_S = 60.0


def _start_cluster(log: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,  # HOSTILE_RUNS among them
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.hostile.settings",
        "Q_WORKERS": "2",
        "DA_LOG": "WARNING",
    }
    with log.open("w") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def _stop_cluster(cluster: subprocess.Popen[str]) -> int:
    if cluster.poll() is None:
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait()
    return cluster.returncode


def _await(predicate: Callable[[], bool], timeout: float) -> bool:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if predicate():
            return True
        time.sleep(0.1)  # polling an observable condition of another process
    return predicate()


def test_live_cluster__every_hostile_case_runs_once_and_every_surface_answers(
    runs_file: Path, tmp_path: Path, operator: Client, api: tuple[TestClient, dict[str, str]]
) -> None:
    failing_after = int(conf.get("FAILING_AFTER_PASSES"))
    hosts = {case.name: Host.objects.create(key=f"live-{case.name}") for case in CASES}
    submissions: dict[str, int] = {}
    log = tmp_path / "cluster.log"
    cluster = _start_cluster(log)
    try:
        for case in CASES:
            host = hosts[case.name]
            if case.agent:
                submissions[case.name] = durable_agent.submit(
                    host=host, thread="t", agent=case.name, payload={}
                ).submission_id
            else:
                gate.schedule(host, case.name, timezone.now())

        def finished() -> bool:
            for case in CASES:
                if case.agent:
                    state = Submission.objects.get(pk=submissions[case.name]).state
                    if state != case.state:
                        return False
                else:
                    failed = PassRecord.objects.filter(host=hosts[case.name], phase="failed")
                    if failed.count() < failing_after:
                        return False
            return True

        done = _await(finished, BUDGET_S)
        time.sleep(3 * LEASE_TTL_S)  # a run that did not settle would run again by now
        alive = cluster.poll() is None
    finally:
        returncode = _stop_cluster(cluster)
    output = log.read_text(errors="replace")
    context = output[-4000:]
    assert done, context
    assert alive, context
    assert returncode == 0, context
    assert "reincarnated" not in output, context
    assert "Could not save task result" not in output, context
    failed_tasks = list(Task.objects.filter(success=False).values_list("result", flat=True))
    assert failed_tasks, "the lanes' passes failed: their tasks should be stored as failed"
    assert all(unstorable(result) is None for result in failed_tasks)

    client, headers = api
    for case in CASES:
        host = hosts[case.name]
        detail = client.get(f"hosts/{host.key}", headers=headers)
        assert detail.status_code == 200, detail.content
        page = operator.get(reverse("admin:durable_agent_host_change", args=[host.pk]))
        assert page.status_code == 200
        if case.agent:
            assert runs(str(runs_file), case.name) == 1, case.name
            row = Submission.objects.get(pk=submissions[case.name])
            assert (row.state, row.error) == (case.state, case.error), case.name
            body = client.get(f"submissions/{row.pk}", headers=headers)
            assert body.status_code == 200, body.content
            assert body.json()["error"] == case.error
            page = operator.get(reverse("admin:durable_agent_submission_change", args=[row.pk]))
            assert page.status_code == 200
            assert case.shown in shown(page.content)
            assert detail.json()["failing"] is False, case.name
        else:
            errors = list(
                PassRecord.objects.filter(host=host, phase="failed").values_list("error", flat=True)
            )
            assert len(errors) >= failing_after, case.name
            # Each pass recorded its lane's run; a pass the cluster's stop cut short may not.
            assert runs(str(runs_file), case.name) - len(errors) in (0, 1), case.name
            assert set(errors) == {case.error}, case.name
            assert detail.json()["failing"] is True, case.name
            assert detail.json()["last_error"] == case.error
            assert case.shown in shown(page.content)
            result = command_json(host)  # runs the lane only if its backoff has passed
            if not result["passes"][0]["ok"]:
                assert result["passes"][0]["error"].endswith(case.error), result
