"""Contention: producers, operators and a live cluster's passes on the same rows, over HTTP.

16 producer threads submit through ``POST hosts/{key}/threads/{thread}/submissions`` of a real
threaded HTTP server (pytest-django's ``live_server``, which serves ``project/urls.py``) to new
threads and to threads they share, on four hosts, while a live ``qcluster`` subprocess fires
the hosts' alarms and its passes settle the work. At the same time operator threads abort
submissions (in whatever state they have reached), answer approval requests (approve, reject or
abort) and re-arm the hosts, all through the same API. Nothing is retried: every response is
counted by operation and status.

Checked: no response >= 500 and no failed request, ``pg_stat_database.deadlocks`` of the test
database unchanged, every accepted submission in the ledger once and settled with the outcome
the operators' answers call for, and no agent run beyond one per claim and one claim per
approval (the agent's own run and side-effect lines, see tests/reliability/contention_agents.py).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import connection

from durable_agent.agents import registry
from durable_agent.api.tokens import issue_token
from durable_agent.models import Host, Submission
from tests.procs import ROOT, database_url
from tests.reliability import contention_agents

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PREFIX = "/api/durable-agent/"
HOSTS = 4  # the last one is single-threaded
PRODUCERS = 16
PER_PRODUCER = 6
SHARED_THREADS = 3
# Submissions the aborter aborts, by n % 12, and the state it waits for first.
ABORT_AT = {1: "ready", 7: "ready", 5: "running", 11: "running", 9: "settled"}
REQUEST_TIMEOUT = 20.0  # seconds; a request that takes longer counts as failed
BUDGET = 50.0  # seconds for the whole load and its settling; the test fails past it


@dataclass
class Api:
    """A tiny HTTP client: one connection per request, every outcome counted, no retries."""

    host: str
    port: int
    secret: str = field(repr=False)
    statuses: Counter[tuple[str, int | str]] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, operation: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.secret}"}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=REQUEST_TIMEOUT)
        try:
            conn.request(method, PREFIX + path, body=data, headers=headers)
            response = conn.getresponse()
            status, raw = response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            with self.lock:
                self.statuses[(operation, type(exc).__name__)] += 1
                self.failures.append(f"{method} {path}: {exc!r}")
            return 0, None
        finally:
            conn.close()
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw[:200]
        with self.lock:
            self.statuses[(operation, status)] += 1
            if status >= 500:
                self.failures.append(f"{method} {path}: {status} {decoded}")
        return status, decoded


@dataclass
class Ledger:
    """What the clients saw: accepted submissions and the operators' answers that took."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    accepted: dict[int, dict[str, Any]] = field(default_factory=dict)
    aborted: set[int] = field(default_factory=set)  # abort answered 200
    approved: set[int] = field(default_factory=set)  # approve(true) answered 200
    rejected: set[int] = field(default_factory=set)  # approve(false) answered 200
    unanswered: set[int] = field(default_factory=set)  # approvals never seen suspended
    abort_landed: Counter[str] = field(default_factory=Counter)  # aim -> seen -> answer


@pytest.fixture
def contention_agent() -> Iterator[None]:
    saved = registry.snapshot()
    contention_agents.register()
    yield
    registry.restore(saved)


def _deadlocks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def _other_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def _start_cluster(effects: Path, log: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.reliability.contention_settings",
        "Q_WORKERS": "2",
        "DA_LOG": "WARNING",
        contention_agents.EFFECTS_ENV: str(effects),
    }
    with log.open("w") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def _stop_cluster(cluster: subprocess.Popen[str]) -> int:
    if cluster.poll() is None:
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(timeout=30)
        except subprocess.TimeoutExpired:
            cluster.kill()
            cluster.wait()
    return cluster.returncode


def _producer(api: Api, ledger: Ledger, index: int) -> None:
    for j in range(PER_PRODUCER):
        n = index * PER_PRODUCER + j
        host = f"contention-{(index + j) % HOSTS}"
        thread = f"new-{index}-{j}" if j % 2 == 0 else f"shared-{j % SHARED_THREADS}"
        approval = n % 7 == 3
        abort_at = None if approval else ABORT_AT.get(n % 12)
        work_ms = 300 if abort_at == "running" else 5  # long enough to be seen running
        payload = {"n": n, "approval": approval, "work_ms": work_ms}
        status, body = api.call(
            "submit",
            "POST",
            f"hosts/{host}/threads/{thread}/submissions",
            {"agent": contention_agents.AGENT, "payload": payload, "idempotency_key": f"c-{n}"},
        )
        if status == 201:
            with ledger.lock:
                ledger.accepted[int(body["submission_id"])] = {
                    "approval": approval,
                    "abort_at": abort_at,
                }


def _aborter(api: Api, ledger: Ledger, producing: threading.Event, until: float) -> None:
    """Abort each submission marked for it once it reaches its state: ready (at once),
    running, or settled (a 409). It watches states in the database (its own connection,
    closed at the end) and aborts through the API."""
    done: set[int] = set()
    try:
        while time.monotonic() < until:
            with ledger.lock:
                waiting = {
                    sid: info["abort_at"]
                    for sid, info in ledger.accepted.items()
                    if info["abort_at"] and sid not in done
                }
            if not waiting and not producing.is_set():
                return
            states = dict(Submission.objects.filter(pk__in=waiting).values_list("pk", "state"))
            for sid, at in sorted(waiting.items()):
                state = states[sid]
                if at == "ready" or state == at or (at == "running" and state == "settled"):
                    done.add(sid)
                    status, body = api.call("abort", "POST", f"submissions/{sid}/abort")
                    with ledger.lock:
                        if status == 200:
                            ledger.aborted.add(sid)
                        landed = body["state"] if status == 200 else f"{status}"
                        ledger.abort_landed[f"{at}->{state}->{landed}"] += 1
            time.sleep(0.02)  # polling an observable condition
    finally:
        connection.close()


def _approver(api: Api, ledger: Ledger, producing: threading.Event, until: float) -> None:
    """Answer every approval request once it is suspended: approve, reject or abort.

    It finds suspended submissions in the database (its own connection, closed at the end)
    and answers through the API.
    """
    answered: set[int] = set()
    try:
        while time.monotonic() < until:
            with ledger.lock:
                waiting = [
                    sid
                    for sid, info in ledger.accepted.items()
                    if info["approval"] and sid not in answered
                ]
            if not waiting and not producing.is_set():
                return
            suspended = Submission.objects.filter(pk__in=waiting, state="suspended")
            for sid in sorted(suspended.values_list("pk", flat=True)):
                answered.add(sid)
                # Reject, approve, abort in turn: every answer is given once three are waiting.
                turn = len(answered) % 3
                if turn == 0:
                    status, _ = api.call("abort", "POST", f"submissions/{sid}/abort")
                    target = ledger.aborted
                else:
                    approved = turn == 2
                    status, _ = api.call(
                        "approve", "POST", f"submissions/{sid}/approve", {"approved": approved}
                    )
                    target = ledger.approved if approved else ledger.rejected
                if status == 200:
                    with ledger.lock:
                        target.add(sid)
            time.sleep(0.05)  # polling an observable condition
    finally:
        connection.close()
        with ledger.lock:
            ledger.unanswered = {
                sid
                for sid, info in ledger.accepted.items()
                if info["approval"] and sid not in answered
            }


def _rearmer(api: Api, producing: threading.Event) -> None:
    n = 0
    while producing.is_set():
        api.call("rearm", "POST", f"hosts/contention-{n % HOSTS}/rearm", {"reason": "contention"})
        n += 1
        time.sleep(0.01)  # pacing: about one rearm per host every 50 ms


def _read_effects(path: Path) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    runs: dict[int, list[int]] = defaultdict(list)
    effects: dict[int, list[int]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            kind, sid, attempt = line.split()
            (runs if kind == "run" else effects)[int(sid)].append(int(attempt))
    return runs, effects


def test_contention__api_producers_operators_and_live_passes(
    live_server: Any, contention_agent: None, tmp_path: Path
) -> None:
    for i in range(HOSTS):
        Host.objects.create(key=f"contention-{i}", single_thread=i == HOSTS - 1)
    url = urlsplit(live_server.url)
    assert url.hostname is not None
    assert url.port is not None
    api = Api(url.hostname, url.port, issue_token(name="contention", scope="repair").secret)
    ledger = Ledger()
    effects, log = tmp_path / "effects.log", tmp_path / "qcluster.log"
    deadlocks_before = _deadlocks()
    started = time.monotonic()
    until = started + BUDGET

    cluster = _start_cluster(effects, log)
    try:
        producing = threading.Event()
        producing.set()
        producers = [
            threading.Thread(target=_producer, args=(api, ledger, i), daemon=True)
            for i in range(PRODUCERS)
        ]
        operators = [
            threading.Thread(target=fn, args=(api, ledger, producing, until), daemon=True)
            for fn in (_aborter, _approver)
        ]
        operators.append(threading.Thread(target=_rearmer, args=(api, producing), daemon=True))
        for thread in [*operators, *producers]:
            thread.start()
        for thread in producers:
            thread.join(timeout=max(0.0, until - time.monotonic()))
        submitted = time.monotonic() - started
        producing.clear()
        for thread in operators:
            thread.join(timeout=max(0.0, until - time.monotonic()))
        alive = [t.name for t in [*producers, *operators] if t.is_alive()]
        answered = time.monotonic() - started

        ids = set(ledger.accepted)
        while time.monotonic() < until:
            if not Submission.objects.filter(pk__in=ids).exclude(state="settled").exists():
                break
            time.sleep(0.1)  # polling an observable condition
        settled_after = time.monotonic() - started
    finally:
        returncode = _stop_cluster(cluster)
    give_up = time.monotonic() + 10
    while (lingering := _other_backends()) and time.monotonic() < give_up:
        time.sleep(0.1)  # polling: a backend flushes its statistics when it exits
    deadlocks = _deadlocks() - deadlocks_before

    summary = {
        "statuses": dict(sorted(api.statuses.items(), key=str)),
        "accepted": len(ids),
        "aborted": len(ledger.aborted),
        "abort_landed": dict(ledger.abort_landed),
        "approved": len(ledger.approved),
        "rejected": len(ledger.rejected),
        "deadlocks": deadlocks,
        "lingering_backends": lingering,
        "submitting_s": round(submitted, 1),
        "answering_s": round(answered, 1),
        "settled_s": round(settled_after, 1),
        "total_s": round(time.monotonic() - started, 1),
    }
    print("contention:", summary)
    tail = log.read_text()[-3000:]
    failures = api.failures
    assert not failures, (summary, failures[:20])
    assert deadlocks == 0, summary
    assert lingering == 0, ("connections to the test database outlived the load", summary)
    assert not alive, (f"client threads still running after {BUDGET} s: {alive}", summary)
    assert returncode == 0, tail
    assert {k for k in api.statuses if k[0] == "submit"} == {("submit", 201)}, summary
    assert {k[1] for k in api.statuses if k[0] in ("approve", "rearm")} <= {200}, summary
    assert {k[1] for k in api.statuses if k[0] == "abort"} <= {200, 409}, summary
    assert not ledger.unanswered, ("approval requests never seen suspended", ledger.unanswered)

    rows = {
        row["pk"]: row
        for row in Submission.objects.filter(host__key__startswith="contention-").values(
            "pk", "state", "outcome", "attempts"
        )
    }
    assert set(rows) == ids, ("the ledger differs from the accepted receipts", summary)
    unsettled = {pk: row["state"] for pk, row in rows.items() if row["state"] != "settled"}
    assert not unsettled, (unsettled, summary, tail)
    runs, side_effects = _read_effects(effects)
    assert set(runs) <= ids, "the agent ran for a submission nobody accepted"
    assert set(side_effects) <= ids
    wrong = [
        f"{pk}: {problem}"
        for pk, row in sorted(rows.items())
        for problem in _problems(row, ledger, runs.get(pk, []), side_effects.get(pk, []))
    ]
    assert not wrong, (wrong[:20], summary)
    outcomes = Counter(row["outcome"] for row in rows.values())
    effect_lines = sum(len(lines) for lines in side_effects.values())
    print("contention outcomes:", dict(outcomes), "side effects:", effect_lines)
    # Each path was taken: aborts of ready and running work, approvals and rejections.
    assert any("->ready->" in k for k in ledger.abort_landed), summary
    assert any("->running->" in k for k in ledger.abort_landed), summary
    assert ledger.approved, summary
    assert ledger.rejected, summary


def _problems(
    row: Mapping[str, Any], ledger: Ledger, runs: list[int], effects: list[int]
) -> Iterator[str]:
    """What is wrong with one settled submission, given the operators' answers that took.

    Without a crash every claim runs the agent once, and only an approval claims again.
    """
    pk, attempts = row["pk"], row["attempts"]
    approvals = 1 if pk in ledger.approved else 0
    if pk in ledger.aborted:
        expected = "aborted"
    elif pk in ledger.rejected:
        expected = "failed"
    else:
        expected = "completed"
    if row["outcome"] != expected:
        yield f"outcome {row['outcome']}, expected {expected}"
    if attempts > 1 + approvals or (expected == "completed" and attempts != 1 + approvals):
        yield f"{attempts} claims with {approvals} approvals and no crash"
    if sorted(runs) != list(range(1, attempts + 1)):
        yield f"agent runs (by attempt) {sorted(runs)} for {attempts} claims"
    if expected == "completed" and effects != [attempts]:
        yield f"side effects (by attempt) {effects} for a completed submission"
    if expected == "failed" and effects:
        yield f"side effects (by attempt) {effects} for a rejected submission"
    if expected == "aborted" and len(effects) > 1:
        yield f"side effects (by attempt) {effects} for an aborted submission"
