"""``manage.py maintenance_pass --all`` over idle hosts: the time a host.

    python -m bench.pass_all [--hosts 3000] [--runs 3] [--pending 0]

``--hosts`` hosts, each caught up by its first-use pass (nothing due, no submission), then
``--pending`` of them (spread evenly) given one fresh submission of the trivial agent
``bench-immediate`` each, as an operator's ``--all`` over a mostly idle deployment meets them.
Then ``python manage.py maintenance_pass --all`` runs as an operator runs it: a process of
its own on the bench database, its output piped (one line per host, Note [Passes stream] in
``durable_agent/management/commands/maintenance_pass.py``). Measured: the command's wall time
from start to exit, divided by the hosts it passed (the process's start and Django's setup
included), and the same command with ``--host`` of one host (the start alone). Every line
must be a pass report, every exit status 0 and the count of lines the number of hosts: any
``FAILED`` line, another status or a missing line is counted as an error and ends the
benchmark with a non-zero exit instead of a table. Goal: at most 6 ms a host
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from bench.common import ROOT, machine, reset, setup, table


def load(hosts: int, pending: int) -> list[str]:
    """Create the hosts, caught up, and give ``pending`` of them a fresh submission."""
    from django.db import connection

    from bench.lateness import prepare
    from durable_agent.agents import services
    from durable_agent.models import Host

    reset()
    ids = prepare(hosts)
    keys = dict(Host.objects.filter(pk__in=ids).values_list("pk", "key"))
    if pending:
        step = max(1, (hosts - 1) // pending)  # never the last host: the start is timed on it
        for host_id in ids[:-1][::step][:pending]:
            services.submit(
                host=keys[host_id], thread="t", agent="bench-immediate", payload={"n": host_id}
            )
    with connection.cursor() as cursor:  # the statistics a running deployment's tables have
        cursor.execute("ANALYZE")
    connection.close()  # the command's process is the only client while it runs
    return [keys[host_id] for host_id in ids]


def command(*args: str) -> tuple[float, list[str], int, str]:
    """Run ``manage.py maintenance_pass`` with ``args``: (seconds, output lines, status,
    the end of stderr)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "manage.py", "maintenance_pass", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    return seconds, done.stdout.splitlines(), done.returncode, done.stderr[-500:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pending", type=int, default=0)
    args = parser.parse_args()
    if not 0 <= args.pending <= args.hosts:
        parser.error("--pending must be between 0 and --hosts")
    setup()
    rows = []
    errors = 0
    for run in range(args.runs):
        keys = load(args.hosts, args.pending)
        start, _, status, _ = command("--host", keys[-1])  # a host without a submission
        errors += status != 0
        seconds, lines, status, tail = command("--all")
        selected = set(keys)
        reports = [line for line in lines if line.split(": ", 1)[0] in selected]
        failed = sum(1 for line in lines if "FAILED" in line)
        bad = (status != 0) + failed + (len(reports) != args.hosts)
        if bad:
            print(
                f"run {run + 1}: status {status}, {failed} FAILED, {len(reports)} of "
                f"{args.hosts} reports; stderr: {tail}",
                file=sys.stderr,
            )
        errors += bad
        rows.append(
            [
                run + 1,
                args.hosts,
                args.pending,
                len(reports),
                seconds,
                seconds * 1000 / args.hosts,
                start,
                (seconds - start) * 1000 / args.hosts,
            ]
        )
    if errors:
        raise SystemExit(f"{errors} errors; no table")
    per_host = statistics.median(row[5] for row in rows)
    table(
        f"maintenance_pass --all over {args.hosts} hosts, {args.pending} with a fresh submission, "
        f"{args.runs} runs ({machine()})",
        [
            "run",
            "hosts",
            "pending",
            "reports",
            "seconds",
            "ms a host",
            "one host's command s",
            "ms a host without the start",
        ],
        rows,
    )
    print(f"median: {per_host:.2f} ms a host (goal <= 6)")


if __name__ == "__main__":
    main()
