"""A burst pass's client cost in instructions, a figure this machine's noise does not move.

    python -m bench.pass_cost [--passes 200] [--small 40] [--warm 20]

CPU time per pass moves by a sixth from one run to the next on a shared two-core machine, so a
change of a few percent in the pass's own work cannot be told from noise by timing it. This
counts instructions instead, with valgrind's callgrind (it must be installed): the burst's
pass (one due host lane whose handler inserts a row, ``fire_alarms`` in deliveries of four
hosts, as the cluster runs it) run in one process against the bench database, no cluster.
Each size is its own process under callgrind over a freshly loaded database (``--warm``
unmeasured passes first, then ``--small`` or ``--passes`` passes); the instructions a pass
costs are the difference between the two processes' totals divided by the difference in
passes, so the process's start, Django's setup and the warm-up cancel out. Counted: the client
process alone (Python, psycopg, libpq), not the server nor the kernel.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from bench.common import ROOT, machine, setup, table

STATE = Path("/tmp/bench-pass-cost.txt")


def load(hosts: int) -> None:
    """A fresh bench database with ``hosts`` caught-up hosts, each with a ``burst`` host lane
    due in a moment; their ids and the deadline go to ``STATE`` for the measured process."""
    from django.db import connection
    from django.utils import timezone

    from bench.benchapp.models import Fact
    from bench.common import reset
    from bench.lateness import prepare
    from durable_agent.maintenance import gate

    reset()
    Fact.objects.all().delete()
    ids = prepare(hosts)
    due = timezone.now() + timedelta(seconds=0.2)
    for host_id in ids:
        gate.schedule(host_id, "burst", due)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    connection.close()
    STATE.write_text(f"{due.isoformat()}\n{' '.join(map(str, ids))}\n")


def child(warm: int, passes: int) -> None:
    """The measured process: ``warm`` passes, then ``passes`` more; prints the rows written."""
    import django

    django.setup()
    from bench.benchapp.models import Fact
    from durable_agent import tasks
    from durable_agent.tasks import fire_alarms

    # Under callgrind a pass runs about fifty times slower: a delivery of four would outrun
    # its time budget and re-arm its last hosts instead of running them (a count of rows
    # short of the passes). The budget is not what is measured here.
    tasks.BATCH_BUDGET_SECONDS = float("inf")

    first, second = STATE.read_text().splitlines()
    due = datetime.fromisoformat(first)
    ids = [int(value) for value in second.split()][: warm + passes]
    time.sleep(max(0.0, due.timestamp() - time.time()) + 0.05)
    for start in range(0, len(ids), 4):
        fire_alarms([[host_id, due] for host_id in ids[start : start + 4]])
    print(f"rows {Fact.objects.count()}")


def instructions(warm: int, passes: int) -> int:
    """Load the database, run ``child`` under callgrind: the instructions it executed."""
    load(warm + passes)
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "bench.pass_cost",
        "--child",
        str(warm),
        str(passes),
    ]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    rows = re.search(r"^rows (\d+)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or rows is None or int(rows.group(1)) != warm + passes:
        raise SystemExit(
            f"the measured process failed ({done.returncode}, {done.stdout.strip()!r} for "
            f"{warm + passes} passes): {done.stderr[-800:]}"
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no total: {done.stderr[-800:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--small", type=int, default=40)
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt install valgrind)")
    if not 0 < args.small < args.passes:
        parser.error("--small must be between 0 and --passes")
    setup()
    small = instructions(args.warm, args.small)
    large = instructions(args.warm, args.passes)
    per_pass = (large - small) / (args.passes - args.small)
    table(
        f"A burst pass's client instructions ({machine()})",
        [
            "smaller run: passes",
            "its instructions",
            "larger run: passes",
            "its instructions",
            "instructions a pass",
        ],
        [[args.small, small, args.passes, large, round(per_pass)]],
    )


if __name__ == "__main__":
    main()
