"""The hostile cases (tests/hostile/cases.py) through every surface, in this process.

Each case starts once (a submission for an agent, a due lane for a lane) and its passes run
through one of the four ways a pass is started: django-q's scheduler and the alarm task it
enqueues (``fire_alarm``, as a worker runs it), the API's ``POST hosts/{key}/pass``, the
admin's "Run a maintenance pass now" and ``maintenance_pass --json``. Each way must answer its
own contract (no exception escapes, JSON errors, one line of JSON). Then every surface that
shows the outcome is read: the API's submission and host, the admin's submission and host
pages, ``maintenance_pass --json``.

Checked: an agent runs exactly once (also after its lease would have expired) and settles (or
suspends) once with its storable error; a lane fails every pass, each pass leaves its
``PassRecord`` with the storable error, and the host turns failing after
``FAILING_AFTER_PASSES`` passes. Runs on SQLite and, with ``DATABASE_URL``, PostgreSQL (which
refuses what SQLite stores).
"""

from __future__ import annotations

import html
import io
import json
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.brokers import get_broker
from django_q.exceptions import TimeoutException
from django_q.models import OrmQ, Task
from django_q.scheduler import scheduler
from ninja.testing import TestClient

import durable_agent
from durable_agent import conf
from durable_agent.maintenance import alarm, gate
from durable_agent.models import Host, PassRecord, Submission
from durable_agent.testing import FakeClock
from tests.hostile.cases import CASES, Case, runs
from tests.qdrive import scheduler_clock

pytestmark = pytest.mark.django_db(transaction=True)

SURFACES = ["task", "api", "admin", "command"]


def fire_due(clock: FakeClock) -> list[Task]:
    """django-q's scheduler at the fake time, then each task it enqueued run and stored as
    django-q's worker and monitor do (``django_q/worker.py``: the result of a task that raised
    is ``f"{e} : {traceback.format_exc()}"``, stored in a ``Task`` row)."""
    with scheduler_clock(clock):
        scheduler(broker=get_broker())
    stored = []
    for row in OrmQ.objects.order_by("pk"):
        task = row.task
        target = import_string(task["func"])
        task["started"] = timezone.now()
        try:
            result = (target(*task.get("args", ()), **task.get("kwargs", {})), True)
        except (Exception, TimeoutException) as e:  # the worker's own clause
            result = (f"{e} : {traceback.format_exc()}", False)
        stored.append(
            Task.objects.create(
                id=task["id"],
                name=task["name"],
                func=task["func"],
                args=task["args"],
                kwargs=task["kwargs"],
                started=task["started"],
                stopped=timezone.now(),
                result=result[0],
                success=result[1],
            )
        )
        row.delete()
    return stored


def start(case: Case, host: Host, clock: FakeClock) -> int | None:
    if case.agent:
        receipt = durable_agent.submit(host=host, thread="t", agent=case.name, payload={})
        return receipt.submission_id
    gate.schedule(host, case.name, clock.now())
    return None


def at_slot(host: Host, clock: FakeClock) -> bool:
    """Move the clock just past the host's slot; False when the slot is disarmed."""
    due = alarm.scheduled(host)
    if due is None:
        return False
    if due >= clock.now():
        clock.set(due + timedelta(microseconds=1))
    return True


def run_pass_through(
    surface: str,
    host: Host,
    clock: FakeClock,
    operator: Client,
    api: tuple[TestClient, dict[str, str]],
) -> None:
    """One pass of ``host``, started by ``surface``; asserts the surface's own contract."""
    assert at_slot(host, clock), "the host should be armed"
    if surface == "task":
        tasks = fire_due(clock)  # what a django-q worker runs; an escape fails the test
        assert len(tasks) == 1
    elif surface == "api":
        client, headers = api
        response = client.post(f"hosts/{host.key}/pass", json={"reason": "x"}, headers=headers)
        body = response.json()
        if response.status_code != 200:
            assert response.status_code == 500, body
            assert body["code"] == "pass_failed", body
            assert set(body) == {"code", "message", "detail"}, body
    elif surface == "admin":
        response = operator.post(
            reverse("admin:durable_agent_host_changelist"),
            {
                "action": "run_pass_now",
                "_selected_action": [str(host.pk)],
                "post": "yes",
                "reason": "x",
            },
            follow=True,
        )
        assert response.status_code == 200
        messages = [str(m) for m in response.context["messages"]]
        assert any(m.startswith(f"{host.key}:") for m in messages), messages
    else:
        command_json(host)


def command_json(host: Host) -> dict[str, Any]:
    """``maintenance_pass --host KEY --json``: one JSON object, whatever the pass did."""
    out = io.StringIO()
    failure = ""
    try:
        call_command("maintenance_pass", "--host", host.key, "--json", stdout=out)
    except CommandError as exc:
        failure = str(exc)
    result: dict[str, Any] = json.loads(out.getvalue())
    assert [p["host"] for p in result["passes"]] == [host.key], result
    assert bool(failure) == bool(result["failed"]), failure
    return result


def shown(page: bytes | str) -> str:
    text = page.decode() if isinstance(page, bytes) else page
    return html.unescape(text)


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile__runs_once_settles_once_and_every_surface_answers(
    case: Case,
    surface: str,
    clock: FakeClock,
    runs_file: Path,
    operator: Client,
    api: tuple[TestClient, dict[str, str]],
) -> None:
    host = Host.objects.create(key=f"hostile-{case.name}")
    submission_id = start(case, host, clock)
    passes = 1 if case.agent else int(conf.get("FAILING_AFTER_PASSES"))
    for _ in range(passes):
        run_pass_through(surface, host, clock, operator, api)
    # Later alarms, past the agent's lease: nothing runs the agent again.
    clock.advance(ms=conf.agent_lease_ttl() // timedelta(milliseconds=1) + 60_000)
    if case.agent:
        for _ in range(5):
            if not at_slot(host, clock):
                break
            fire_due(clock)

    client, headers = api
    detail = client.get(f"hosts/{host.key}", headers=headers)
    assert detail.status_code == 200, detail.content
    host_page = operator.get(reverse("admin:durable_agent_host_change", args=[host.pk]))
    assert host_page.status_code == 200
    if case.agent:
        assert runs(str(runs_file), case.name) == 1
        row = Submission.objects.get(pk=submission_id)
        assert row.state == case.state, (row.state, row.error)
        assert row.error == case.error
        if case.state == "suspended":
            assert row.approval_reason == "ship it"
        else:
            assert row.outcome == "failed"
        body = client.get(f"submissions/{submission_id}", headers=headers)
        assert body.status_code == 200, body.content
        assert body.json()["error"] == case.error
        page = operator.get(reverse("admin:durable_agent_submission_change", args=[submission_id]))
        assert page.status_code == 200
        assert case.shown in shown(page.content)
        assert not PassRecord.objects.filter(host=host, phase="failed").exists()
        assert detail.json()["failing"] is False
    else:
        assert runs(str(runs_file), case.name) == passes
        errors = list(
            PassRecord.objects.filter(host=host, phase="failed").values_list("error", flat=True)
        )
        assert errors == [case.error] * passes
        assert detail.json()["failing"] is True, detail.json()
        assert detail.json()["last_error"] == case.error
        assert case.shown in shown(host_page.content)
        result = command_json(host)  # one more pass: it fails, and the JSON says why
        assert result["failed"] == 1
        assert result["passes"][0]["error"].endswith(case.error), result
