"""The chaos soak: live clusters, producers, SIGKILLs and dropped connections, then a check.

    python -m bench.soak [--seconds 60] [--hosts 50] [--clusters 3] [--producers 3]

For ``--seconds``: ``--clusters`` live ``qcluster`` processes (two workers each, with the fast
path) run alarm-driven passes while ``--producers`` processes submit to ``--hosts`` hosts;
a chaos loop SIGKILLs whole clusters (and restarts them) and terminates random PostgreSQL
connections with ``pg_terminate_backend``. Then chaos stops, the clusters keep running until
every submission settles (or ``--settle-timeout`` passes), and the script checks: every
submission settled exactly once, the invariant audit is clean. Prints a summary; exits 1 on
any failure. Uses its own database (``SOAK_DATABASE_URL``, default ``durable_agent_soak``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

os.environ.setdefault(
    "BENCH_DATABASE_URL",
    os.environ.get("SOAK_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/durable_agent_soak"),
)
# Short leases so that killed work is recovered within the run.
os.environ.setdefault("DA_SOAK", "1")

from bench.common import ROOT, reset, setup

PRODUCER = """
import random, sys, time
import django
django.setup()
import durable_agent
from django.db import DatabaseError, InterfaceError, connections
from durable_agent.errors import AlarmError
seed, until = int(sys.argv[1]), float(sys.argv[2])
hosts, rate = int(sys.argv[3]), float(sys.argv[4])
rng = random.Random(seed)
accepted = 0
n = 0
while time.time() < until:
    n += 1
    request = dict(
        host=f"soak-{rng.randrange(hosts)}", thread=f"t{rng.randrange(4)}",
        agent=rng.choice(["soak-safe", "soak-plain"]), payload={"n": n},
        idempotency_key=f"p{seed}-{n}",
    )
    for _ in range(20):  # a client retries with the same idempotency key until it knows
        try:
            durable_agent.submit(**request)
            accepted += 1
            break
        except (DatabaseError, InterfaceError, AlarmError):
            connections.close_all()  # a terminated connection: retry the same key
            time.sleep(0.05)
    time.sleep(rng.uniform(0.5, 1.5) / rate)  # about `rate` submissions per second
print(accepted)
"""


@dataclass
class Chaos:
    kills: int = 0
    terminations: int = 0
    restarts: int = 0
    log: list[str] = field(default_factory=list)


def start_cluster(index: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "Q_WORKERS": "2"}
    return subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a process group: SIGKILL takes the workers down too
    )


def kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def terminate_connections(rng: random.Random) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        pids = [row[0] for row in cursor.fetchall()]
        victims = rng.sample(pids, min(len(pids), rng.randint(1, 3)))
        for pid in victims:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    return len(victims)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument(
        "--rate", type=float, default=2.0, help="submissions per second per producer"
    )
    parser.add_argument("--settle-timeout", type=float, default=420)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    setup()
    from django.db import connections
    from django.db.models import Count, Max

    from bench.benchapp.models import Execution
    from durable_agent.maintenance.audit import audit_all
    from durable_agent.models import Host, PassRecord, Submission
    from durable_agent.runtime import get_runtime

    reset()
    Execution.objects.all().delete()
    Host.objects.bulk_create(
        [Host(key=f"soak-{i}", single_thread=i % 3 == 0) for i in range(args.hosts)]
    )
    connections.close_all()
    chaos = Chaos()
    started = time.time()
    until = started + args.seconds
    clusters = [start_cluster(i) for i in range(args.clusters)]
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
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(args.producers)
    ]
    try:
        while time.time() < until:
            time.sleep(rng.uniform(2, 5))  # the chaos cadence
            if time.time() >= until:
                break
            if rng.random() < 0.5:
                victim = rng.randrange(len(clusters))
                kill_group(clusters[victim])
                chaos.kills += 1
                time.sleep(rng.uniform(0, 1.5))
                clusters[victim] = start_cluster(victim)
                chaos.restarts += 1
            else:
                try:
                    chaos.terminations += terminate_connections(rng)
                except Exception as exc:  # our own connection may be the one that broke
                    chaos.log.append(f"terminate: {exc}")
                    connections.close_all()
        accepted = 0
        for producer in producers:
            out, err = producer.communicate(timeout=120)
            if producer.returncode != 0:
                print(err.decode()[-2000:], file=sys.stderr)
                return 1
            accepted += int(out.decode().strip().splitlines()[-1])
        connections.close_all()
        give_up = time.time() + args.settle_timeout
        registry_key = get_runtime().binding_registry_key()
        while time.time() < give_up:
            # Settled, and every host's alarm quiet (checked while the clusters still run).
            if (
                not Submission.objects.exclude(state="settled").exists()
                and audit_all(registry_key=registry_key).ok
            ):
                break
            for i, cluster in enumerate(clusters):  # a cluster that died on its own restarts
                if cluster.poll() is not None:
                    clusters[i] = start_cluster(i)
                    chaos.restarts += 1
            time.sleep(1)
    finally:
        for cluster in clusters:
            if cluster.poll() is None:
                cluster.send_signal(signal.SIGTERM)
        for cluster in clusters:
            try:
                cluster.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill_group(cluster)
    connections.close_all()
    total = Submission.objects.count()
    unsettled = Submission.objects.exclude(state="settled").count()
    outcomes = dict(
        Submission.objects.values_list("outcome")
        .annotate(n=Count("id"))
        .values_list("outcome", "n")
    )
    runs = Execution.objects.values("submission_id").annotate(n=Count("id"))
    reran = sum(1 for r in runs if r["n"] > 1)
    never_ran = (
        Submission.objects.filter(outcome="completed")
        .exclude(pk__in=Execution.objects.values("submission_id"))
        .count()
    )
    summary = audit_all(registry_key=get_runtime().binding_registry_key())
    passes = PassRecord.objects.count()
    max_late = PassRecord.objects.aggregate(m=Max("lateness_ms"))["m"]
    elapsed = time.time() - started
    ok = (
        total == accepted
        and unsettled == 0
        and never_ran == 0
        and summary.ok
        and set(outcomes) <= {"completed"}
    )
    print(
        "\n".join(
            [
                "### Chaos soak",
                "",
                "| measure | value |",
                "| --- | --- |",
                f"| seed | {args.seed} |",
                f"| chaos seconds | {args.seconds:g} |",
                f"| total seconds (chaos + settling) | {elapsed:.0f} |",
                f"| hosts / clusters / producers | {args.hosts} / {args.clusters} / "
                f"{args.producers} |",
                f"| submissions accepted (producers) | {accepted} |",
                f"| submissions in the ledger | {total} |",
                f"| unsettled | {unsettled} |",
                f"| outcomes | {outcomes} |",
                f"| agents re-run after a crash (retry-safe or never marked) | {reran} |",
                f"| cluster SIGKILLs / restarts | {chaos.kills} / {chaos.restarts} |",
                f"| connections terminated | {chaos.terminations} |",
                f"| passes recorded | {passes} |",
                f"| max lateness ms | {max_late} |",
                f"| audit | {'clean' if summary.ok else summary.as_dict()} |",
                f"| result | {'PASS' if ok else 'FAIL'} |",
            ]
        ),
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
