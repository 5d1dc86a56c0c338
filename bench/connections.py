"""The PostgreSQL connections one cluster holds while it runs agent work (docs/deployment.md).

    DATABASE_URL=postgres://... python -m bench.connections [--workers 2] [--hosts 6]
                                                            [--submissions 60]

Runs the example project's ``manage.py qcluster`` (``--workers`` workers, the recommended
``Q_CLUSTER``, persistent connections) on the database ``DATABASE_URL`` names, submits
``--submissions`` inputs of the example's ``summarise`` agent over ``--hosts`` hosts and three
threads per host (so passes run several attempts at once on their thread pool), and samples
``pg_stat_activity`` every 0.1 s until every submission settled and 2 s after. Each backend is
traced to the cluster process that opened it (its client port, through ``ss -tnp``), and the
process to its role (the leader, its sentinel, and the sentinel's children: the pusher, the
monitor and the workers). The table shows, per process, the most connections it held at once.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def descendants(root: int) -> dict[int, int]:
    """Every process below ``root`` (and itself), with its depth under it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(parent(int(entry.name)), []).append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
    found, todo = {root: 0}, [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            found[child] = found[pid] + 1
            todo.append(child)
    return found


def port_owners() -> dict[int, int]:
    """Local TCP port -> owning pid, for the connections to PostgreSQL's port."""
    owners = {}
    output = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True, check=True).stdout
    for line in output.splitlines():
        fields = line.split()
        if len(fields) < 6 or not fields[4].endswith(":5432"):
            continue
        match = re.search(r"pid=(\d+)", line)
        if match:
            owners[int(fields[3].rsplit(":", 1)[1])] = int(match.group(1))
    return owners


def sample(root: int) -> Counter[int]:
    """Connections per cluster process right now."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT client_port FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND client_port IS NOT NULL"
        )
        ports = [row[0] for row in cursor.fetchall()]
    owners, tree = port_owners(), descendants(root)
    return Counter(owners[p] for p in ports if owners.get(p) in tree)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hosts", type=int, default=6)
    parser.add_argument("--submissions", type=int, default=60)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("Set DATABASE_URL to a PostgreSQL database")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    import durable_agent
    from durable_agent.models import Host, Submission

    call_command("migrate", verbosity=0)
    log = Path(tempfile.mkstemp(prefix="bench-connections-", suffix=".log")[1])
    env = {**os.environ, "Q_WORKERS": str(args.workers)}
    with log.open("w") as out:
        cluster = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    most: Counter[int] = Counter()
    total = 0
    try:
        while "] running." not in log.read_text():
            if cluster.poll() is not None:
                raise SystemExit(log.read_text())
            time.sleep(0.1)
        hosts = [Host.objects.get_or_create(key=f"connections-{i}")[0] for i in range(args.hosts)]
        first = Submission.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        for n in range(args.submissions):
            durable_agent.submit(
                host=hosts[n % len(hosts)],
                thread=f"t{n % 3}",
                agent="summarise",
                payload={"text": f"words {n} " * 50},
            )
        settled_at = None
        give_up = time.monotonic() + 120
        while settled_at is None or time.monotonic() < settled_at + 2:
            now = sample(cluster.pid)
            total = max(total, sum(now.values()))
            for pid, count in now.items():
                most[pid] = max(most[pid], count)
            if settled_at is None and not (
                Submission.objects.filter(pk__gt=first).exclude(state="settled").exists()
            ):
                settled_at = time.monotonic()
            if time.monotonic() > give_up:
                raise SystemExit("the submissions did not settle within 120 s")
            time.sleep(0.1)
        depths = descendants(cluster.pid)
    finally:
        cluster.send_signal(signal.SIGTERM)
        cluster.wait(timeout=60)
    roles = {0: "leader", 1: "sentinel"}
    print(f"workers={args.workers} hosts={args.hosts} submissions={args.submissions}")
    print("| process | depth | most connections at once |")
    print("| --- | --- | --- |")
    for pid in sorted(depths, key=lambda p: (depths[p], -most[p])):
        role = roles.get(depths[pid], "pusher, monitor or worker")
        print(f"| {pid} ({role}) | {depths[pid]} | {most[pid]} |")
    print(f"most connections of the whole cluster at once: {total}")


if __name__ == "__main__":
    main()
