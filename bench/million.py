"""A million hosts: firing, the sweep, the audit, ``GET health`` and the host lists.

    python -m bench.million [--hosts 1000000] [--base 1000] [--runs 3] [--lost 1000]

Loads ``--base`` hosts, measures, then loads ``--hosts`` hosts afresh and measures again, so
every table compares the two sizes. The hosts are clones of two hosts the app itself made
(``ensure_alarm``, a pass, ``gate.schedule``), copied column for column in SQL
(``INSERT ... SELECT ... generate_series``): every host has its ``MaintenanceState`` row, its
native lane and its django-q ``Schedule`` slot. One host in ten is armed (its slot holds the
deadline of a second lane, a day ahead); the others are caught up with a disarmed slot
(``repeats=0``), as a pass leaves them. ``--lost`` of the disarmed hosts owe work (a dirty
generation) without an armed slot: the audit reports them and the sweep re-arms them. After
the firing rounds, one host in 1 000 gets a parked lane, one in 1 000 three failed passes in a
row (failing), one in 10 000 an armed slot an hour overdue: every list filter finds hosts.

Measured:

- **firing**: django-q's scheduler firing 100 due slots and the fast path's probe (the method of
  ``bench/firing_scale.py``), and the cost at ``--hosts`` over the cost at ``--base``;
- **walks**: ``durable_agent.tasks.sweep``, ``audit_all`` and ``GET health`` (through the API),
  each in a fresh subprocess that reports its time and its peak RSS (``ru_maxrss``) above the
  RSS it had before the first run;
- **lists**: the admin host list and ``GET hosts`` (first page, a deep page, filters and
  orderings) with their query counts and any sequential scan of a large table in the plans of
  their queries (``EXPLAIN``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

from bench.common import ROOT, machine, reset, setup, summary, table

DUE = 100
#: A sequential scan of a table the planner expects to read this many rows from is reported.
LARGE_SCAN = 50_000


# -- loading -------------------------------------------------------------------------------


def _columns(cursor: Any, name: str) -> list[str]:
    cursor.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "ORDER BY ordinal_position",
        [name],
    )
    return [row[0] for row in cursor.fetchall()]


def _clone(
    cursor: Any,
    name: str,
    *,
    proto: str,
    series: tuple[int, int],
    which: str,
    values: dict[str, str],
) -> int:
    """Copy the prototype rows (``proto``: a condition on ``p``) once per ``g`` in ``series``
    for which ``which`` holds, with ``values`` (SQL over ``p`` and ``g``) replacing columns;
    ``id`` columns not in ``values`` take their default."""
    columns = [c for c in _columns(cursor, name) if c != "id" or "id" in values]
    select = ", ".join(values.get(c, f"p.{c}") for c in columns)
    cursor.execute(
        f"INSERT INTO {name} ({', '.join(columns)}) SELECT {select} "
        f"FROM {name} p CROSS JOIN generate_series({series[0]:d}, {series[1]:d}) g "
        f"WHERE {proto} AND ({which})"
    )
    return int(cursor.rowcount)


def prototypes() -> tuple[int, int]:
    """An idle host and an armed one, made by the app: the clones copy their rows."""
    from durable_agent import clock
    from durable_agent.maintenance import gate
    from durable_agent.maintenance.passes import ensure_alarm, run_pass
    from durable_agent.models import Host

    idle = Host.objects.create(key="proto-idle")
    ensure_alarm(idle)
    assert run_pass(idle.pk, deadline=clock.now(), guard=False).alarm == "cleared"
    armed = Host.objects.create(key="proto-armed")
    ensure_alarm(armed)
    run_pass(armed.pk, deadline=clock.now(), guard=False)
    gate.schedule(armed, "bench", clock.now() + timedelta(days=1))
    armed.refresh_from_db()
    assert armed.alarm is not None
    assert armed.alarm.repeats == 1
    return idle.pk, armed.pk


def load(total: int, lost: int) -> dict[str, Any]:
    """``total`` hosts (the two prototypes among them); returns the classes and the time."""
    from django.db import connection

    started = time.perf_counter()
    idle, armed = prototypes()
    first = armed + 1
    last = first + total - 3
    every = max(10, (total // max(lost, 1)) // 10 * 10)  # lost: g % every == 5, never armed
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM django_q_schedule")
        offset = cursor.fetchone()[0] + 1 - first  # schedule id = g + offset
        cursor.execute(
            "SELECT id, alarm_id FROM durable_agent_host WHERE id IN (%s, %s)", [idle, armed]
        )
        slots = dict(cursor.fetchall())
        series = (first, last)
        is_armed, is_idle = "g % 10 = 0", "g % 10 <> 0"
        spread = "(g % 86400) * interval '1 second'"  # armed deadlines spread over a day
        for proto, which in ((slots[idle], is_idle), (slots[armed], is_armed)):
            _clone(
                cursor,
                "django_q_schedule",
                proto=f"p.id = {proto}",
                series=series,
                which=which,
                values={
                    "id": f"g + {offset}",
                    "name": "'durable_agent:host:' || g",
                    "args": "g::text",
                    "next_run": f"p.next_run + {spread}" if which == is_armed else "p.next_run",
                },
            )
        _clone(
            cursor,
            "durable_agent_host",
            proto=f"p.id = {idle}",
            series=series,
            which="true",
            values={
                "id": "g",
                "key": "'h' || lpad(g::text, 7, '0')",
                "created_at": "now()",
                "alarm_id": f"g + {offset}",
            },
        )
        for proto, which in ((idle, is_idle), (armed, is_armed)):
            _clone(
                cursor,
                "durable_agent_maintenancestate",
                proto=f"p.host_id = {proto}",
                series=series,
                which=which,
                values={
                    "host_id": "g",
                    "dirty": f"p.dirty + (g % {every} = 5)::int",
                },
            )
            _clone(
                cursor,
                "durable_agent_duelane",
                proto=f"p.host_id = {proto}",
                series=series,
                which=which,
                values={
                    "host_id": "g",
                    "due_at": f"p.due_at + {spread}",
                },
            )
        for sequence, table_name in (
            ("durable_agent_host_id_seq", "durable_agent_host"),
            ("django_q_schedule_id_seq", "django_q_schedule"),
        ):
            cursor.execute(f"SELECT setval('{sequence}', (SELECT max(id) FROM {table_name}))")
        cursor.execute("VACUUM ANALYZE")
        cursor.execute("SELECT count(*) FROM durable_agent_host")
        hosts = cursor.fetchone()[0]
        cursor.execute(
            "SELECT count(*) FROM durable_agent_maintenancestate WHERE dirty > processed"
        )
        dirty = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM django_q_schedule WHERE repeats <> 0")
        armed_count = cursor.fetchone()[0]
        cursor.execute("SELECT pg_database_size(current_database())")
        size = cursor.fetchone()[0]
    return {
        "hosts": hosts,
        "armed": armed_count,
        "lost": dirty,
        "seconds": time.perf_counter() - started,
        "mib": size / 2**20,
    }


def sicken() -> dict[str, int]:
    """After firing (which expects only its own slots due): one host in 1 000 gets a parked
    lane, one in 1 000 three failed passes in a row, one in 10 000 an armed slot an hour
    overdue, so that each list filter has hosts to find."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE durable_agent_duelane SET state = 'parked', stalls = 8, due_at = NULL "
            "WHERE host_id % 1000 = 3"
        )
        parked = cursor.rowcount
        cursor.execute(
            "INSERT INTO durable_agent_passrecord (host_id, started_at, phase, recovered, "
            "settled, alarm, error) SELECT h.id, now() - n * interval '1 minute', 'failed', "
            "0, 0, '', 'bench: a failed pass' FROM durable_agent_host h "
            "CROSS JOIN generate_series(1, 3) n WHERE h.id % 1000 = 7"
        )
        failing = cursor.rowcount // 3
        cursor.execute(
            "UPDATE django_q_schedule SET next_run = now() - interval '1 hour' WHERE id IN "
            "(SELECT alarm_id FROM durable_agent_host WHERE id % 10000 = 0) AND repeats <> 0"
        )
        overdue = cursor.rowcount
        cursor.execute("ANALYZE")
    return {"parked": parked, "failing": failing, "overdue": overdue}


# -- firing (bench/firing_scale.py's method) ---------------------------------------------------


def firing(runs: int) -> dict[str, float]:
    from django.utils import timezone
    from django_q.brokers import get_broker
    from django_q.models import OrmQ, Schedule
    from django_q.scheduler import scheduler

    from durable_agent.broker import next_armed_run

    due = list(
        Schedule.objects.exclude(repeats=0).order_by("pk").values_list("pk", "next_run")[:DUE]
    )
    ids = [pk for pk, _ in due]
    broker = get_broker()
    scans, probes = [], []
    for _ in range(max(runs, 5)):
        Schedule.objects.filter(pk__in=ids).update(
            repeats=1, next_run=timezone.now() - timedelta(seconds=1)
        )
        OrmQ.objects.all().delete()
        started = time.perf_counter()
        first = next_armed_run()
        probes.append((time.perf_counter() - started) * 1000)
        assert first is not None
        assert first <= timezone.now()
        started = time.perf_counter()
        scheduler(broker=broker)
        scans.append((time.perf_counter() - started) * 1000)
        assert OrmQ.objects.count() == DUE, OrmQ.objects.count()
    OrmQ.objects.all().delete()
    for pk, when in due:  # back to their day-ahead deadlines: the walks see a healthy fleet
        Schedule.objects.filter(pk=pk).update(repeats=1, next_run=when)
    return {"scan": summary(scans)["p50"], "probe": summary(probes)["p50"]}


# -- phases in a subprocess ------------------------------------------------------------------


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _client() -> Any:
    from django.test import Client

    return Client(HTTP_HOST="127.0.0.1")


def _api_client() -> tuple[Any, dict[str, str]]:
    from durable_agent.api.tokens import issue_token
    from durable_agent.models import ApiToken

    ApiToken.objects.filter(name="bench-million").delete()
    token = issue_token(name="bench-million", scope="read")
    return _client(), {"HTTP_AUTHORIZATION": f"Bearer {token.secret}"}


def _admin_client() -> Any:
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    user = user_model.objects.filter(username="bench").first()
    if user is None:
        user = user_model.objects.create_superuser("bench", "bench@example.com", "bench")
    client = _client()
    client.force_login(user)
    return client


def _sweep_once() -> dict[str, Any]:
    from django.db.models import F
    from django.utils import timezone
    from django_q.models import Schedule

    from durable_agent import conf
    from durable_agent.models import Host, MaintenanceState
    from durable_agent.tasks import sweep

    lost = MaintenanceState.objects.filter(dirty__gt=F("processed"))
    ids = Host.objects.filter(pk__in=lost.values("host_id")).values("alarm_id")
    # Lose their alarms again, fired longer ago than the grace a fired slot's delivery gets
    # (Note [A fired slot is not a lost one] in durable_agent/tasks.py), so the sweep re-arms them.
    fired = timezone.now() - timedelta(milliseconds=int(conf.get("SWEEP_GRACE_MS")) + 1000)
    Schedule.objects.filter(pk__in=ids).update(repeats=0, next_run=fired)
    started = time.perf_counter()
    result = sweep()
    return {"ms": (time.perf_counter() - started) * 1000, "result": result["rearmed"]}


def _audit_once() -> dict[str, Any]:
    from durable_agent.maintenance.operators.audit import audit_all
    from durable_agent.runtime import get_runtime

    started = time.perf_counter()
    summary_ = audit_all(registry_key=get_runtime().binding_registry_key())
    return {"ms": (time.perf_counter() - started) * 1000, "result": len(summary_.violating)}


def _health_once(client: Any, headers: dict[str, str]) -> dict[str, Any]:
    started = time.perf_counter()
    response = client.get("/api/durable-agent/health", **headers)
    elapsed = (time.perf_counter() - started) * 1000
    assert response.status_code == 200, response.content[:500]
    return {"ms": elapsed, "result": response.json()["counts"]["violating"]}


def walk(phase: str, runs: int) -> dict[str, Any]:
    """Run one walk ``runs`` times in this (fresh) process: time, result, peak RSS growth."""
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    if phase == "health":
        client, headers = _api_client()
        once = lambda: _health_once(client, headers)  # noqa: E731
    else:
        once = {"sweep": _sweep_once, "audit": _audit_once}[phase]
    before = _rss_mib()
    timings, results, queries = [], [], 0
    for run in range(runs):
        if run == 0:
            with CaptureQueriesContext(connection) as captured:
                outcome = once()
            queries = len(captured)
            reset_queries()
        else:
            outcome = once()
        timings.append(outcome["ms"])
        results.append(outcome["result"])
    return {
        "phase": phase,
        "p50": summary(timings)["p50"],
        "max": max(timings),
        "result": results[0],
        "queries": queries,
        "rss": _rss_mib(),
        "growth": _rss_mib() - before,
    }


def _in_subprocess(phase: str, runs: int) -> dict[str, Any]:
    output = subprocess.run(
        [sys.executable, "-m", "bench.million", "--phase", phase, "--runs", str(runs)],
        cwd=ROOT,
        env=os.environ,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return dict(json.loads(output.stdout.strip().splitlines()[-1]))


# -- the lists -----------------------------------------------------------------------------


def _large_scans(sql: str, params: Any) -> list[str]:
    """Tables a plan reads with a sequential scan of more than LARGE_SCAN rows."""
    from django.db import connection

    found: list[str] = []

    def walk_plan(node: dict[str, Any]) -> None:
        if node.get("Node Type") == "Seq Scan" and node.get("Plan Rows", 0) > LARGE_SCAN:
            found.append(str(node.get("Relation Name")))
        for child in node.get("Plans", []):
            walk_plan(child)

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    walk_plan((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    return found


def _timed_get(client: Any, url: str, runs: int, **headers: str) -> dict[str, Any]:
    """p50 of ``runs`` GETs, the queries of one, and the tables any of them seq-scans."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(url, **headers)  # warm
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, **headers)
    # A copy now: the next request empties the connection's query log the context reads.
    queries = list(captured.captured_queries)
    assert response.status_code == 200, (url, response.status_code, response.content[:300])
    scans: set[str] = set()
    for query in queries:
        sql = query["sql"]
        if sql.lstrip().upper().startswith("SELECT"):
            scans.update(_large_scans(sql, None))
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        client.get(url, **headers)
        timings.append((time.perf_counter() - started) * 1000)
    return {
        "response": response,
        "queries": len(queries),
        "p50": summary(timings)["p50"],
        "max": max(timings),
        "scans": ", ".join(sorted(scans)) or "none",
    }


ADMIN_VIEWS = [
    ("first page", ""),
    ("middle page", "?p={middle}"),
    ("search a key", "?q=h0000123"),
    ("failing", "?failing=yes"),
    ("overdue", "?overdue=yes"),
    ("parked", "?parked=yes"),
    ("faulted", "?faulted=yes"),
    ("dirty", "?dirty=yes"),
    ("binding waits", "?binding=yes"),
    ("single thread", "?single_thread__exact=1"),
    ("by key, descending", "?o=-1"),
]


def admin_list(runs: int) -> list[list[Any]]:
    from durable_agent.models import Host

    client = _admin_client()
    middle = Host.objects.count() // 100 // 2  # the admin's pages hold 100 hosts
    rows = []
    for name, query in ADMIN_VIEWS:
        seen = _timed_get(client, "/admin/durable_agent/host/" + query.format(middle=middle), runs)
        rows.append([name, seen["queries"], seen["p50"], seen["max"], seen["scans"]])
    return rows


def api_list(runs: int) -> list[list[Any]]:
    from durable_agent.api.hosts import encode_host_cursor
    from durable_agent.models import Host

    client, headers = _api_client()
    middle = Host.objects.order_by("pk").values_list("pk", flat=True)[
        Host.objects.count() // 2
    ]  # a one-off position: what a client reaches by following `next`
    rows = []
    base = "/api/durable-agent/hosts?limit=50"
    for name, url in (
        ("first page", base),
        ("middle (cursor)", f"{base}&cursor={encode_host_cursor(middle)}"),
        ("dirty", f"{base}&dirty=true"),
        ("overdue", f"{base}&overdue=true"),
        ("parked", f"{base}&parked=true"),
        ("faulted", f"{base}&faulted=true"),
        ("failing", f"{base}&failing=true"),
    ):
        seen = _timed_get(client, url, runs, **headers)
        items = len(seen["response"].json()["items"])
        rows.append([name, items, seen["queries"], seen["p50"], seen["max"], seen["scans"]])
    return rows


def lists(runs: int) -> dict[str, Any]:
    before = _rss_mib()
    result = {"admin": admin_list(runs), "api": api_list(runs)}
    return {**result, "growth": _rss_mib() - before}


# -- the run ---------------------------------------------------------------------------------


def measure(size: int, lost: int, runs: int) -> dict[str, Any]:
    reset()
    loaded = load(size, lost)
    print(
        f"loaded {loaded['hosts']} hosts ({loaded['armed']} armed, {loaded['lost']} lost) "
        f"in {loaded['seconds']:.1f} s; database {loaded['mib']:.0f} MiB",
        flush=True,
    )
    from django.db import connections

    fired = firing(runs)
    loaded.update(sicken())
    connections.close_all()
    walks = [_in_subprocess(phase, runs) for phase in ("audit", "health", "sweep")]
    listed = _in_subprocess("lists", runs)
    return {"load": loaded, "firing": fired, "walks": walks, "lists": listed}


def report(sizes: list[int], results: list[dict[str, Any]], runs: int) -> None:
    where = machine()
    table(
        f"Loading the hosts ({where})",
        ["hosts", "armed", "lost alarms", "overdue", "parked", "failing", "load s", "database MiB"],
        [
            [
                r["load"]["hosts"],
                r["load"]["armed"],
                r["load"]["lost"],
                r["load"]["overdue"],
                r["load"]["parked"],
                r["load"]["failing"],
                r["load"]["seconds"],
                r["load"]["mib"],
            ]
            for r in results
        ],
    )
    base = results[0]["firing"]["scan"]
    table(
        f"Firing {DUE} due alarms (p50 of {max(runs, 5)} rounds)",
        ["hosts", "scan p50 ms", "probe p50 ms", "scan / first"],
        [
            [
                r["load"]["hosts"],
                r["firing"]["scan"],
                r["firing"]["probe"],
                r["firing"]["scan"] / base,
            ]
            for r in results
        ],
    )
    table(
        f"Walking every host ({runs} runs, each walk in a fresh process)",
        ["hosts", "walk", "found", "queries", "p50 ms", "max ms", "peak RSS MiB", "RSS growth MiB"],
        [
            [
                r["load"]["hosts"],
                w["phase"],
                w["result"],
                w["queries"],
                w["p50"],
                w["max"],
                w["rss"],
                w["growth"],
            ]
            for r in results
            for w in r["walks"]
        ],
    )
    table(
        f"Admin host list ({runs} requests each)",
        ["hosts", "view", "queries", "p50 ms", "max ms", "large seq scans"],
        [[r["load"]["hosts"], *row] for r in results for row in r["lists"]["admin"]],
    )
    table(
        f"API host list, GET hosts?limit=50 ({runs} requests each)",
        ["hosts", "page", "items", "queries", "p50 ms", "max ms", "large seq scans"],
        [[r["load"]["hosts"], *row] for r in results for row in r["lists"]["api"]],
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=1_000_000)
    parser.add_argument("--base", type=int, default=1000, help="the size compared against")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lost", type=int, default=None, help="default: one host in 1 000")
    parser.add_argument("--phase", help=argparse.SUPPRESS)  # a walk, in a subprocess
    args = parser.parse_args()
    if args.phase:
        import django

        django.setup()
        result = lists(args.runs) if args.phase == "lists" else walk(args.phase, args.runs)
        print(json.dumps(result, default=str))
        return
    setup()
    sizes = [args.base, args.hosts] if args.base and args.base != args.hosts else [args.hosts]
    results = [
        measure(size, args.lost if args.lost is not None else max(10, size // 1000), args.runs)
        for size in sizes
    ]
    report(sizes, results, args.runs)


if __name__ == "__main__":
    main()
