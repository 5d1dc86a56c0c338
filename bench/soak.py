"""The chaos soak: live clusters, producers, operators, SIGKILLs and dropped connections.

    python -m bench.soak [--seconds 60] [--hosts 50] [--clusters 3] [--producers 3]
                         [--api-producers 8] [--operators 2]

For ``--seconds``:

- ``--clusters`` live ``qcluster`` processes (two workers each, with the fast path) run
  alarm-driven passes;
- ``--producers`` processes submit through ``durable_agent.submit`` and ``--api-producers``
  threads POST ``hosts/{key}/threads/{thread}/submissions`` to the example project's API,
  served by a threaded WSGI server process (bench/soak_server.py): shared threads and new
  ones, each request with its own idempotency key, retried with that key until answered;
- ``--operators`` threads repair at the same time, half through the API and half through the
  Python services: rearm, run a pass, schedule lane work, unpark a lane (a 404 or 409 when it
  is not parked), and approve, reject or abort every submission of the ``soak-approval`` agent
  (which suspends for approval);
- a chaos loop SIGKILLs whole clusters (and restarts them) and terminates random PostgreSQL
  connections of the soak database with ``pg_terminate_backend``.

Then chaos stops, the clusters keep running until every submission settles (or
``--settle-timeout`` passes), and the script checks:

- every accepted submission is in the ledger once, settled with the outcome its agent and the
  operator's decision call for, and ran (or did not run) accordingly;
- no agent ran twice unless the process or the connection that ran it first was killed, or its
  first attempt failed by design (``soak-retry``, retried by its ``RetryPolicy``); every
  completed ``soak-retry`` submission took at least two attempts (the retried attempts are
  counted);
- the invariant audit is clean;
- every error anywhere (a producer's exception, a 5xx response, an unexpected 4xx, a failed
  django-q task, an ERROR log record in any soak process) is counted, and only an error on a
  connection the soak terminated is excused (bench/faults.py); retries and replays are counted;
- ``pg_stat_database.deadlocks`` of the soak database did not grow.

Prints a summary; exits 1 on any failure. Uses its own database (``SOAK_DATABASE_URL``,
default ``durable_agent_soak``), dropped and created afresh.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault(
    "BENCH_DATABASE_URL",
    os.environ.get("SOAK_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/durable_agent_soak"),
)
# Short leases so that killed work is recovered within the run; error accounting everywhere.
os.environ.setdefault("DA_SOAK", "1")
os.environ.setdefault("SOAK_SOURCE", "soak")

from bench import faults
from bench.common import ROOT, percentile, reset, setup

AGENTS = ["soak-safe", "soak-plain", "soak-approval", "soak-retry"]
AGENT_WEIGHTS = [40, 40, 10, 10]
MAX_ATTEMPTS = 30  # per request; a client that gives up is an error
DECISIONS = ("approve", "reject", "abort")
EXPECTED_OUTCOME = {"approve": "completed", "reject": "failed", "abort": "aborted"}

PRODUCER = """
import json, random, sys, time
import django
django.setup()
import durable_agent
from django.db import connections
from bench import faults
from bench.soak import AGENTS, AGENT_WEIGHTS, MAX_ATTEMPTS
seed, until = int(sys.argv[1]), float(sys.argv[2])
hosts, rate = int(sys.argv[3]), float(sys.argv[4])
rng = random.Random(seed)
stats = {"accepted": 0, "retries": 0, "replayed": 0, "gave_up": 0}
n = 0
while time.time() < until:
    n += 1
    request = dict(
        host=f"soak-{rng.randrange(hosts)}", thread=f"t{rng.randrange(4)}",
        agent=rng.choices(AGENTS, AGENT_WEIGHTS)[0], payload={"n": n},
        idempotency_key=f"p{seed}-{n}",
    )
    for attempt in range(MAX_ATTEMPTS):  # a client retries with the same key until it knows
        try:
            receipt = durable_agent.submit(**request)
        except Exception as exc:
            faults.record_exception("producer", exc, key=request["idempotency_key"])
            connections.close_all()
            stats["retries"] += 1
            time.sleep(min(1.0, 0.05 * 2**attempt))
            continue
        stats["accepted"] += 1
        if not receipt.created:
            if attempt == 0:
                faults.record("producer", "unexpected_replay", repr(receipt))
            stats["replayed"] += 1  # the failed attempt had committed after all
        break
    else:
        stats["gave_up"] += 1
        faults.record("producer", "gave_up", repr(request))
    time.sleep(rng.uniform(0.5, 1.5) / rate)  # about `rate` submissions per second
print(json.dumps(stats))
"""


@dataclass
class Chaos:
    kills: int = 0
    restarts: int = 0
    killed_os_pids: set[int] = field(default_factory=set)
    terminated: dict[int, float] = field(default_factory=dict)  # backend pid -> when

    @property
    def terminated_pids(self) -> set[int]:
        return set(self.terminated)


@dataclass
class Tally:
    """Counters shared by the client threads (under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: Counter[str] = field(default_factory=Counter)
    expected_4xx: Counter[str] = field(default_factory=Counter)
    failed_requests: list[dict[str, Any]] = field(default_factory=list)  # 5xx, by request id
    intended: dict[int, str] = field(default_factory=dict)  # submission id -> decision
    ambiguous: set[int] = field(default_factory=set)  # a decision that failed mid-way

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def soak_env(source: str) -> dict[str, str]:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "SOAK_SOURCE": source}


def start_cluster(index: int, logs: Path) -> subprocess.Popen[bytes]:
    env = {**soak_env(f"cluster{index}"), "Q_WORKERS": "2"}
    with open(logs / f"cluster{index}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group: SIGKILL takes the workers down too
        )


def group_members(pgid: int) -> set[int]:
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                members.add(int(stat.parent.name))
    return members


def kill_group(process: subprocess.Popen[bytes], chaos: Chaos | None = None) -> None:
    if chaos is not None:
        chaos.killed_os_pids |= group_members(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def terminate_connections(rng: random.Random, chaos: Chaos) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        pids = [row[0] for row in cursor.fetchall()]
        for pid in rng.sample(pids, min(len(pids), rng.randint(1, 3))):
            chaos.terminated[pid] = time.time()  # before: its owner may fail at once
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def deadlocks() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


class PostgresLog:
    """The new lines of the server log that name the soak database (evidence, when readable)."""

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname
        self.offsets = {}
        for path in Path("/var/log/postgresql").glob("*.log"):
            with contextlib.suppress(OSError):
                self.offsets[path] = path.stat().st_size

    def deadlock_report(self, limit: int = 40) -> list[str]:
        lines: list[str] = []
        for path, offset in self.offsets.items():
            with contextlib.suppress(OSError), open(path, errors="replace") as log:
                log.seek(offset)
                lines += log.read().splitlines()
        tag = f"@{self.dbname} "
        ours = [line for line in lines if tag in line]
        out: list[str] = []
        shown = -1
        for i, line in enumerate(ours):
            if "deadlock detected" in line and i > shown:
                out += ours[i : i + 5]  # ERROR, DETAIL, HINT, CONTEXT, STATEMENT
                shown = i + 4
        return out[:limit]


class Client:
    """One HTTP client thread's connection to the soak's API server."""

    def __init__(self, port: int, token: str, tally: Tally, source: str) -> None:
        self.port, self.token, self.tally, self.source = port, token, tally, source
        self.conn: http.client.HTTPConnection | None = None

    def call(
        self,
        action: str,
        path: str,
        body: Any,
        *,
        expected: dict[int, set[str]],
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """POST; returns (status, body). 5xx and unexpected statuses are counted as errors;
        (0, None) when the server could not be reached."""
        rid = f"{self.source}-{uuid.uuid4().hex[:12]}"
        all_headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/json",
            "X-Soak-Request": rid,
            **(headers or {}),
        }
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            self.conn.request("POST", "/api/durable-agent/" + path, json.dumps(body), all_headers)
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            with contextlib.suppress(Exception):
                if self.conn is not None:
                    self.conn.close()
            self.conn = None
            faults.record(self.source, "http_transport", f"{action}: {exc!r}", request=rid)
            return 0, None
        status = response.status
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = raw[:200].decode(errors="replace")
        code = data.get("code") if isinstance(data, dict) else None
        self.tally.add(f"http {action} {status}")
        if status >= 500:
            with self.tally.lock:
                self.tally.failed_requests.append(
                    {"request": rid, "status": status, "code": code, "action": action}
                )
        elif status >= 400:
            if code in expected.get(status, set()):
                with self.tally.lock:
                    self.tally.expected_4xx[f"{action} {status} {code}"] += 1
            else:
                faults.record(
                    self.source,
                    "unexpected_4xx",
                    f"{action} {path}: {status} {data}",
                    request=rid,
                )
        return status, data


def api_producer(
    index: int,
    seed: int,
    until: float,
    hosts: int,
    rate: float,
    port: int,
    token: str,
    tally: Tally,
) -> None:
    rng = random.Random(seed)
    client = Client(port, token, tally, f"api-producer{index}")
    n = 0
    while time.time() < until:
        n += 1
        host = f"soak-{rng.randrange(hosts)}"
        thread = f"api{index}-{n}" if rng.random() < 0.3 else f"t{rng.randrange(4)}"
        body = {"agent": rng.choices(AGENTS, AGENT_WEIGHTS)[0], "payload": {"n": n}}
        key = f"a{seed}-{n}"
        for attempt in range(MAX_ATTEMPTS):
            status, data = client.call(
                "submit",
                f"hosts/{host}/threads/{thread}/submissions",
                body,
                expected={},
                headers={"Idempotency-Key": key},
            )
            if status in (200, 201):
                tally.add("api accepted")
                if status == 200:
                    if attempt == 0:
                        faults.record(client.source, "unexpected_replay", f"{key}: {data}")
                    tally.add("api replayed")
                break
            tally.add("api retries")
            time.sleep(min(1.0, 0.05 * 2**attempt))
        else:
            tally.add("api gave up")
            faults.record(client.source, "gave_up", f"{host}/{thread} {key}")
        time.sleep(rng.uniform(0.5, 1.5) / rate)


PY_EXPECTED = {
    "unpark": ("RepairTargetNotFound", "NotRepairable"),
    "rearm": ("RevisionConflict",),
}
API_EXPECTED = {
    "unpark": {404: {"repair_target_not_found"}, 409: {"not_repairable"}},
    "rearm": {409: {"revision_conflict"}},
}


def operator(
    index: int,
    count: int,
    seed: int,
    hosts: int,
    port: int,
    token: str,
    tally: Tally,
    chaos_over: threading.Event,
    stop: threading.Event,
) -> None:
    """Repairs and decisions, through the API and the Python services, until ``stop``."""
    from django.db import connections

    import durable_agent
    from durable_agent import clock
    from durable_agent.maintenance import alarm, gate, repairs
    from durable_agent.models import Submission

    rng = random.Random(seed)
    client = Client(port, token, tally, f"operator{index}")
    source = f"operator{index}"
    reason = f"soak operator {index}"

    def python(action: str, fn: Any) -> bool:
        try:
            fn()
        except Exception as exc:
            if type(exc).__name__ in PY_EXPECTED.get(action, ()):
                with tally.lock:
                    tally.expected_4xx[f"{action} python {type(exc).__name__}"] += 1
                return True
            faults.record_exception(source, exc, action=action)
            connections.close_all()
            return False
        tally.add(f"python {action} ok")
        return True

    def decide(sid: int) -> None:
        decision = DECISIONS[sid * 7 % 3]
        via_api = sid // 3 % 2 == 0
        with tally.lock:
            tally.intended[sid] = decision
            retry = sid in tally.ambiguous
        conflict = {409: {"invalid_submission_state"}} if retry else {}
        if via_api:
            path = f"submissions/{sid}/" + ("abort" if decision == "abort" else "approve")
            body = {} if decision == "abort" else {"approved": decision == "approve"}
            status, _ = client.call(f"decide {decision}", path, body, expected=conflict)
            ok = 200 <= status < 300 or (status == 409 and retry)
        else:
            try:
                if decision == "abort":
                    durable_agent.abort(sid)
                else:
                    durable_agent.approve(sid, approved=decision == "approve")
                ok = True
                tally.add(f"python decide {decision} ok")
            except Exception as exc:
                ok = retry and type(exc).__name__ == "InvalidSubmissionState"
                if ok:
                    with tally.lock:
                        tally.expected_4xx[f"decide python {type(exc).__name__}"] += 1
                else:
                    faults.record_exception(source, exc, action=f"decide {decision}")
                    connections.close_all()
        if not ok:
            with tally.lock:
                tally.ambiguous.add(sid)  # it may have committed: a 409 next time is fine
            tally.add("operator retries")

    while not stop.is_set():
        time.sleep(rng.uniform(0.1, 0.4))
        try:
            suspended = list(
                Submission.objects.filter(agent="soak-approval", state="suspended")
                .order_by("id")
                .values_list("id", flat=True)[:50]
            )
        except Exception as exc:
            faults.record_exception(source, exc, action="list suspended")
            connections.close_all()
            continue
        for sid in suspended:
            if sid % count == index:
                decide(sid)
        if chaos_over.is_set():
            continue  # only decisions once chaos stops: let the hosts settle
        host = f"soak-{rng.randrange(hosts)}"
        action = rng.choice(["rearm", "pass", "unpark", "schedule"])
        if action == "schedule":  # lane work (a source mutation), so unpark finds lanes
            due = clock.now() + timedelta(seconds=rng.uniform(0, 2))
            python(action, functools.partial(gate.schedule, host, "bench", due))
        elif rng.random() < 0.5:
            path = {
                "rearm": f"hosts/{host}/rearm",
                "pass": f"hosts/{host}/pass",
                "unpark": f"hosts/{host}/lanes/bench/unpark",
            }[action]
            client.call(action, path, {"reason": reason}, expected=API_EXPECTED.get(action, {}))
        elif action == "rearm":
            python(action, functools.partial(alarm.rearm, host, actor=source, reason=reason))
        elif action == "pass":
            python(
                action, functools.partial(repairs.pass_now, host=host, actor=source, reason=reason)
            )
        else:
            python(
                action,
                functools.partial(
                    repairs.lane_unpark, host=host, lane="bench", actor=source, reason=reason
                ),
            )
    connections.close_all()


def wait_for_server(port: int, token: str, server: subprocess.Popen[bytes]) -> None:
    give_up = time.time() + 60
    while time.time() < give_up:
        if server.poll() is not None:
            raise SystemExit(f"the API server exited with {server.returncode}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request(
                "GET",
                "/api/durable-agent/hosts?limit=1",
                headers={"Authorization": f"Bearer {token}"},
            )
            if conn.getresponse().status == 200:
                conn.close()
                return
        time.sleep(0.2)
    raise SystemExit("the API server did not answer within 60 s")


def judge(
    rows: list[dict[str, Any]],
    tally: Tally,
    chaos: Chaos,
    owners: dict[int, tuple[int, str]],
) -> tuple[Counter[str], Counter[str], list[dict[str, Any]]]:
    """Split every error into injected (by kind) and unexplained (by kind, with samples)."""
    injected: Counter[str] = Counter()
    unexplained: Counter[str] = Counter()
    samples: list[dict[str, Any]] = []

    def excused(row: dict[str, Any]) -> bool:
        pids = {row.get("pid"), *row.get("process_pids", [])}
        return row["kind"] == faults.TERMINATED and bool(pids & chaos.terminated_pids)

    by_request: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("request"):
            by_request.setdefault(row["request"], []).append(row)
    explained_requests = set()
    for failed in tally.failed_requests:
        causes = by_request.get(failed["request"], [])
        server_causes = [c for c in causes if c["source"].startswith("server")]
        explained_requests.add(failed["request"])
        label = f"http {failed['status']} {failed['code']} ({failed['action']})"
        if server_causes and all(excused(c) for c in server_causes):
            injected[f"{label}: {faults.TERMINATED}"] += 1
        else:
            kinds = ",".join(sorted({c["kind"] for c in server_causes})) or "no cause recorded"
            unexplained[f"{label}: {kinds}"] += 1
            samples.append({**failed, "causes": server_causes})

    def restart_explained(row: dict[str, Any]) -> bool:
        """django-q's sentinel restarts a pusher or monitor that died of a lost connection
        (the pusher exits 10 s after its broker fails; the monitor dies of the exception):
        explained when the soak terminated a connection of that cluster just before."""
        cluster = row["source"].split(":")[0]
        return any(
            owners.get(pid, (0, ""))[1] == cluster and 0 <= row["at"] - when <= 30
            for pid, when in chaos.terminated.items()
        )

    # A failed task's own record keeps only the failure's text (PassError drops its cause);
    # the worker logged the same failure with its traceback just before. That log line, when
    # excused, excuses the task: the same process, the same text, within a few seconds.
    logged = [
        (r["os_pid"], r["at"], m[1])
        for r in rows
        if excused(r) and (m := re.match(r"The pass of host \S+ failed: (.+)", r["message"]))
    ]

    def same_failure_logged(row: dict[str, Any]) -> bool:
        return row["kind"] == "other:task" and any(
            os_pid == row.get("os_pid")
            and abs(row["at"] - at) <= 5
            and row["message"].startswith(text)
            for os_pid, at, text in logged
        )

    for row in rows:
        if row.get("request") in explained_requests and row["source"].startswith("server"):
            continue  # the cause of a 5xx counted above
        if same_failure_logged(row):
            injected["cluster:task: the failure of a pass logged as " + faults.TERMINATED] += 1
            continue
        restarted = re.match(r"reincarnated (\w+) .* after sudden death", row["message"])
        if restarted and restart_explained(row):
            injected[f"cluster: {restarted[1]} restarted after {faults.TERMINATED}"] += 1
            continue
        parts = row["source"].split(":")
        where = ":".join([parts[0].rstrip("0123456789"), *parts[1:2]])
        if excused(row):
            injected[f"{where}: {row['kind']}"] += 1
        else:
            unexplained[f"{where}: {row['kind']}"] += 1
            samples.append(row)
    return injected, unexplained, samples


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument(
        "--rate", type=float, default=2.0, help="submissions per second per producer"
    )
    parser.add_argument("--api-producers", type=int, default=8)
    parser.add_argument(
        "--api-rate", type=float, default=1.0, help="requests per second per API producer"
    )
    parser.add_argument("--operators", type=int, default=2)
    parser.add_argument("--settle-timeout", type=float, default=420)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    errors_dir = Path(tempfile.mkdtemp(prefix="soak-"))
    os.environ["BENCH_ERROR_DIR"] = str(errors_dir)
    setup()
    count_firings()
    from django.conf import settings
    from django.db import connections
    from django.db.models import Count

    from bench.benchapp.models import Execution
    from durable_agent.api.tokens import issue_token
    from durable_agent.maintenance.operators.audit import audit_all
    from durable_agent.models import Host, PassRecord, Submission
    from durable_agent.runtime import get_runtime

    reset()
    Execution.objects.all().delete()
    Host.objects.bulk_create(
        [Host(key=f"soak-{i}", single_thread=i % 3 == 0) for i in range(args.hosts)]
    )
    token = issue_token(name=f"soak-{uuid.uuid4().hex[:8]}", scope="repair").secret
    pg_log = PostgresLog(settings.DATABASES["default"]["NAME"])
    deadlocks_before = deadlocks()
    connections.close_all()
    chaos = Chaos()
    tally = Tally()
    started = time.time()
    until = started + args.seconds
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.soak_server", str(port)],
        cwd=ROOT,
        env={**soak_env("server"), "DJANGO_DEBUG": "0"},
        stdout=open(errors_dir / "server.log", "ab"),  # noqa: SIM115  (the child owns it)
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    clusters = [start_cluster(i, errors_dir) for i in range(args.clusters)]
    producers: list[subprocess.Popen[bytes]] = []
    threads: list[threading.Thread] = []
    chaos_over, stop = threading.Event(), threading.Event()
    accepted = settled_in = 0
    stats: Counter[str] = Counter()
    try:
        wait_for_server(port, token, server)
        producers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    PRODUCER,
                    str(args.seed * 100 + i),
                    str(until),
                    str(args.hosts),
                    str(args.rate),
                ],
                cwd=ROOT,
                env=soak_env(f"producer{i}"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for i in range(args.producers)
        ]
        threads = [
            threading.Thread(
                target=api_producer,
                args=(
                    i,
                    args.seed * 100 + 50 + i,
                    until,
                    args.hosts,
                    args.api_rate,
                    port,
                    token,
                    tally,
                ),
            )
            for i in range(args.api_producers)
        ]
        operators = [
            threading.Thread(
                target=operator,
                args=(
                    i,
                    args.operators,
                    args.seed * 100 + 90 + i,
                    args.hosts,
                    port,
                    token,
                    tally,
                    chaos_over,
                    stop,
                ),
            )
            for i in range(args.operators)
        ]
        for thread in threads + operators:
            thread.start()
        while time.time() < until:
            time.sleep(rng.uniform(2, 5))  # the chaos cadence
            if time.time() >= until:
                break
            if rng.random() < 0.5:
                victim = rng.randrange(len(clusters))
                kill_group(clusters[victim], chaos)
                chaos.kills += 1
                time.sleep(rng.uniform(0, 1.5))
                clusters[victim] = start_cluster(victim, errors_dir)
                chaos.restarts += 1
            else:
                try:
                    terminate_connections(rng, chaos)
                except Exception as exc:  # never our own connection: a real error
                    faults.record_exception("soak", exc, action="terminate")
                    connections.close_all()
        chaos_over.set()
        for thread in threads:
            thread.join()
        for producer in producers:
            out, err = producer.communicate(timeout=300)
            if producer.returncode != 0:
                print(err.decode()[-2000:], file=sys.stderr)
                faults.record("producer", "producer_crashed", err.decode()[-1500:])
                continue
            stats.update(json.loads(out.decode().strip().splitlines()[-1]))
        accepted = stats["accepted"] + tally.counts["api accepted"]
        connections.close_all()
        give_up = time.time() + args.settle_timeout
        registry_key = get_runtime().binding_registry_key()
        settle_start = time.time()
        while time.time() < give_up:
            # Settled, and every host's alarm quiet (checked while the clusters still run).
            if (
                not Submission.objects.exclude(state="settled").exists()
                and audit_all(registry_key=registry_key).ok
            ):
                break
            for i, cluster in enumerate(clusters):  # a cluster that died on its own
                if cluster.poll() is not None:
                    faults.record("soak", "cluster_exited", f"cluster {i}: {cluster.returncode}")
                    clusters[i] = start_cluster(i, errors_dir)
                    chaos.restarts += 1
            time.sleep(1)
        settled_in = round(time.time() - settle_start)
    finally:
        chaos_over.set()
        stop.set()
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join(timeout=120)
        for producer in producers:
            if producer.poll() is None:
                producer.kill()
        for process in [*clusters, server]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in [*clusters, server]:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill_group(process)
    connections.close_all()
    time.sleep(1)  # exited backends have flushed their statistics
    deadlocks_grew = deadlocks() - deadlocks_before
    total = Submission.objects.count()
    unsettled = Submission.objects.exclude(state="settled").count()
    duplicates = (
        Submission.objects.values("thread_id", "idempotency_key")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
    )
    outcomes = Counter(
        f"{agent}: {outcome}"
        for agent, outcome in Submission.objects.values_list("agent", "outcome")
    )
    runs: dict[int, list[tuple[float, int | None, int | None]]] = {}
    failed_by_design: set[tuple[int, int]] = set()  # (submission, run index): a policy retry
    retrying = set(Submission.objects.filter(agent="soak-retry").values_list("id", flat=True))
    for sid, at, os_pid, db_pid, attempt in Execution.objects.order_by("id").values_list(
        "submission_id", "at", "os_pid", "db_pid", "attempt"
    ):
        if sid in retrying and attempt == 1:
            failed_by_design.add((sid, len(runs.get(sid, []))))
        runs.setdefault(sid, []).append((at.timestamp(), os_pid, db_pid))
    retried = Submission.objects.filter(agent="soak-retry", attempts__gte=2)
    retried_attempts = sum(n - 1 for n in retried.values_list("attempts", flat=True))
    not_retried = list(
        Submission.objects.filter(
            agent="soak-retry", outcome="completed", attempts__lt=2
        ).values_list("id", flat=True)[:10]
    )
    wrong_outcome, ran_wrongly = [], []
    for sid, agent, outcome in Submission.objects.filter(state="settled").values_list(
        "id", "agent", "outcome"
    ):
        if agent == "soak-approval":
            decision = tally.intended.get(sid)
            expected = EXPECTED_OUTCOME.get(decision or "", "a decision")
        else:
            expected = "completed"
        if outcome != expected:
            wrong_outcome.append((sid, agent, outcome, expected))
        if (outcome == "completed") != (sid in runs):
            ran_wrongly.append((sid, agent, outcome, len(runs.get(sid, []))))
    reran = {sid: r for sid, r in runs.items() if len(r) > 1}
    owners = faults.read_connections(errors_dir)

    def crashed(first: tuple[float, int | None, int | None], then: float) -> bool:
        """The process that ran ``first`` was killed, or lost a connection to the chaos
        between (about) that run and the next one."""
        at, os_pid, db_pid = first
        return (
            os_pid in chaos.killed_os_pids
            or db_pid in chaos.terminated
            or any(
                owners.get(pid, (0, ""))[0] == os_pid and at - 5 <= when <= then
                for pid, when in chaos.terminated.items()
            )
        )

    unexplained_reruns = {
        sid: r
        for sid, r in reran.items()
        if not all(
            (sid, i) in failed_by_design or crashed(r[i], r[i + 1][0]) for i in range(len(r) - 1)
        )
    }
    summary = audit_all(registry_key=get_runtime().binding_registry_key())
    queued = queued_deliveries()
    firings = fired_slots()
    settled = max(total - unsettled, 1)
    passes = PassRecord.objects.count()
    failed_passes = PassRecord.objects.filter(phase="failed").count()
    lateness = sorted(
        PassRecord.objects.exclude(lateness_ms=None).values_list("lateness_ms", flat=True)
    )
    late = {q: percentile(lateness, q) for q in (50, 99, 100)}
    injected, unexplained, samples = judge(faults.read(errors_dir), tally, chaos, owners)
    (errors_dir / "chaos.json").write_text(
        json.dumps(
            {
                "terminated": chaos.terminated,
                "killed_os_pids": sorted(chaos.killed_os_pids),
                "failed_requests": tally.failed_requests,
            }
        )
    )
    elapsed = time.time() - started
    pg_deadlocks = pg_log.deadlock_report()
    failures = [
        name
        for name, bad in [
            ("ledger != accepted", total != accepted),
            ("duplicated", duplicates),
            ("unsettled", unsettled),
            ("wrong outcome", wrong_outcome),
            ("ran / did not run wrongly", ran_wrongly),
            ("agent re-run without a crash", unexplained_reruns),
            ("soak-retry completed without its retry", not_retried),
            ("audit", not summary.ok),
            ("errors not explained by an injected fault", unexplained),
            ("deadlocks", deadlocks_grew),
        ]
        if bad
    ]
    retries = {
        "python producers": stats["retries"],
        "API producers": tally.counts["api retries"],
        "operator decisions": tally.counts["operator retries"],
    }
    replays = {"python": stats["replayed"], "API": tally.counts["api replayed"]}
    http = {k[5:]: v for k, v in sorted(tally.counts.items()) if k.startswith("http ")}
    python_ops = {k[7:]: v for k, v in sorted(tally.counts.items()) if k.startswith("python ")}
    print(
        "\n".join(
            [
                "### Chaos soak",
                "",
                "| measure | value |",
                "| --- | --- |",
                f"| seed | {args.seed} |",
                f"| chaos seconds | {args.seconds:g} |",
                f"| total seconds (chaos + settling) | {elapsed:.0f} (settled in {settled_in} s) |",
                f"| hosts / clusters | {args.hosts} / {args.clusters} |",
                f"| producers: python / API / operators | {args.producers} / "
                f"{args.api_producers} / {args.operators} |",
                f"| submissions accepted: python / API | {stats['accepted']} / "
                f"{tally.counts['api accepted']} |",
                f"| submissions in the ledger | {total} |",
                f"| duplicated (thread, idempotency key) | {duplicates} |",
                f"| unsettled | {unsettled} |",
                f"| outcomes | {dict(sorted(outcomes.items()))} |",
                f"| wrong outcome / ran wrongly | {len(wrong_outcome)} / {len(ran_wrongly)} |",
                f"| agents re-run: after a kill or a policy retry / unexplained | "
                f"{len(reran) - len(unexplained_reruns)} / {len(unexplained_reruns)} |",
                f"| retried attempts (RetryPolicy): submissions / attempts | "
                f"{retried.count()} / {retried_attempts} |",
                f"| operator decisions (approve, reject, abort) | "
                f"{dict(Counter(tally.intended.values()))} |",
                f"| API responses (action status: count) | {http} |",
                f"| python operator calls ok | {python_ops} |",
                f"| expected 4xx | {dict(sorted(tally.expected_4xx.items()))} |",
                f"| retries (same idempotency key) | {retries} |",
                f"| retries that found the first attempt committed | {replays} |",
                f"| cluster SIGKILLs / restarts | {chaos.kills} / {chaos.restarts} |",
                f"| connections terminated | {len(chaos.terminated_pids)} |",
                f"| errors from injected faults (by kind) | {dict(sorted(injected.items()))} |",
                f"| errors not explained (by kind) | {dict(sorted(unexplained.items()))} |",
                f"| pg_stat_database.deadlocks growth | {deadlocks_grew} |",
                f"| passes recorded / failed | {passes} / {failed_passes} |",
                f"| deliveries queued (django-q tasks through the broker's queue) / per settled "
                f"submission; passes recorded per settled submission | {queued} / "
                f"{queued / settled:.2f}; {passes / settled:.2f} |",
                f"| alarm slots fired (host deliveries) / per settled submission | {firings} / "
                f"{firings / settled:.2f} |",
                f"| pass lateness ms p50 / p99 / max | {late[50]:.0f} / {late[99]:.0f} / "
                f"{late[100]:.0f} |",
                "| load average at the end (1, 5, 15 min; "
                f"{os.cpu_count()} cores) | {' / '.join(f'{x:.1f}' for x in os.getloadavg())} |",
                f"| audit | {'clean' if summary.ok else summary.as_dict()} |",
                f"| result | {'PASS' if not failures else 'FAIL: ' + ', '.join(failures)} |",
            ]
        ),
        flush=True,
    )
    if failures:
        print(f"\nerror records: {errors_dir}", file=sys.stderr)
        for sample in samples[:8]:
            print(json.dumps(sample, default=str)[:1500], file=sys.stderr)
        for item in (wrong_outcome[:5], ran_wrongly[:5], list(unexplained_reruns.items())[:5]):
            if item:
                print(item, file=sys.stderr)
        if pg_deadlocks:
            print("\nPostgreSQL log (deadlocks):", *pg_deadlocks, sep="\n", file=sys.stderr)
        return 1
    shutil.rmtree(errors_dir, ignore_errors=True)  # kept, with the cluster logs, on failure
    return 0


FIRINGS_SQL = """
CREATE TABLE soak_firing (slot integer, task varchar(100));
CREATE FUNCTION soak_count_firing() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO soak_firing VALUES (NEW.id, NEW.task);
    RETURN NEW;
END $$;
CREATE TRIGGER soak_firing AFTER UPDATE ON django_q_schedule FOR EACH ROW
    WHEN (OLD.repeats <> 0 AND NEW.repeats = 0 AND NEW.task IS NOT NULL
          AND NEW.task IS DISTINCT FROM OLD.task)
    EXECUTE FUNCTION soak_count_firing();
"""


def count_firings() -> None:
    """Record every firing of an alarm slot in the soak's fresh database (a trigger on
    django-q's ``Schedule``): a row written from armed to disarmed with a new task id. Unlike
    the queue's rows, this counts hosts, however many of them one task carries."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(FIRINGS_SQL)


def fired_slots() -> int:
    """How many times an alarm slot fired in this soak."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM soak_firing")
        return int(cursor.fetchone()[0])


def queued_deliveries() -> int:
    """How many tasks went through the broker's queue in this soak (alarm deliveries the
    firing enqueued, and anything else enqueued; a prompt pass has no queue row): the rows
    ever inserted into django-q's ``OrmQ`` table of the soak's fresh database, from
    PostgreSQL's statistics (``pg_stat_user_tables.n_tup_ins``)."""
    from django.db import connection
    from django_q.models import OrmQ

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE relname = %s",
            [OrmQ._meta.db_table],
        )
        return int(cursor.fetchone()[0])


if __name__ == "__main__":
    sys.exit(main())
