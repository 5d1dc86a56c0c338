"""Side by side with the peers: durable_agent and five other ways to run a task at a time.

    python -m bench.peers [--runs 3] [--only NAME ...] [--timers 500] [--spread 20]
                          [--burst 1000] [--commit-ops 300] [--immediate 200]
                          [--immediate-rate 20] [--scenarios lateness burst commit immediate]
                          [--hog 0]

One invocation, one machine, one PostgreSQL database (``BENCH_DATABASE_URL``, dropped and
created afresh); every system with two workers and its recommended settings
(``bench/peers/systems.py``). Celery needs Redis (``BENCH_REDIS_URL``, default
``redis://127.0.0.1:6379/7``) and is skipped, with the reason printed, when none answers.

Each system in turn: the commit scenario with no worker running, then its workers start and
run ``--runs`` rounds of the lateness, burst and immediate scenarios, then stop. Immediate:
``--immediate`` tasks for now at ``--immediate-rate`` a second from one client, each enqueued
in its own committed transaction; latency = the task's first statement minus the moment the
enqueue call returned (durable_agent: ``gate.schedule(host, lane, now)``, and ``submit()`` of
a trivial agent in rows of its own). Each cell is the median
of the runs. Every error is counted and shown (a timer that never ran, ran twice, a task the
system reports as failed, an ERROR logged by a worker process, a worker that died); nothing is
retried. ``--hog N`` runs N CPU hogs (a busy loop each, at normal priority) through every
system's measured rounds, started after its warm-up: how each degrades with the cores busy.
Shorter: ``--runs 1``, ``--only``, fewer ``--timers``/``--burst``, ``--spread 10``.

``--interleave`` runs the live scenarios round after round instead: round 1 of every system
(each started, warmed up, run once and stopped), then round 2 of every system, and so on, in
the same order each round (durable_agent last). This machine's speed drifts by a quarter or
more within minutes, and a system whose runs all fall in a slow stretch would otherwise be
judged by it alone; interleaved, each round's drift meets every system.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.peers.settings")

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

from bench.common import machine, setup, table, wait_for
from bench.peers import scenarios
from bench.peers.systems import FACTORIES, DurableAgent, System, build

# How long past its deadline a timer may take before it counts as missing. django-q's stock
# scheduler scans every ~30 s, so it gets more.
PATIENCE = {"dq-stock": 90.0}
DEFAULT_PATIENCE = 60.0


class Column:
    """One system's results over all runs."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.figures: dict[str, list[float]] = {}
        self.errors: Counter[str] = Counter()
        self.notes: list[str] = []
        self.skipped: str | None = None

    def add(self, scenario: str, outcome: scenarios.Outcome) -> None:
        for name, value in outcome.figures.items():
            self.figures.setdefault(f"{scenario} {name}", []).append(value)
        self.errors.update(outcome.errors)
        self.notes += [f"{scenario}: {note}" for note in outcome.notes]

    def median(self, name: str) -> float | None:
        values = self.figures.get(name)
        return statistics.median(values) if values else None


def warm_up(system: System) -> bool:
    """Run two timers due now and wait for both: the workers are up and connected."""
    from django.utils import timezone

    from bench.peers.models import Run

    keys = ["w-0", "w-1"]
    if isinstance(system, DurableAgent):
        system.prepare(keys)
    due = timezone.now() + timedelta(milliseconds=200)
    for key in keys:
        system.arm(key, due)
    runs = Run.objects.filter(system=system.system, key__in=keys)
    ready = wait_for(lambda: runs.count() >= len(keys), timeout=120, interval=0.2)
    time.sleep(scenarios.SETTLE)
    runs.delete()
    return ready


def run_system(
    column: Column,
    args: argparse.Namespace,
    logs: Path,
    runs: range,
    commit: bool = True,
) -> None:
    """The system's commit scenario (with ``commit``), then its workers start, run the live
    scenarios' ``runs`` and stop (none started when ``runs`` is empty)."""
    system = column.system
    if column.skipped:
        return
    reason = system.unavailable()
    if reason:
        column.skipped = reason
        print(f"{system.name}: skipped: {reason}", flush=True)
        return
    system.clean()
    if commit and "commit" in args.scenarios:
        for run in range(args.runs):
            column.add("commit", scenarios.commit(system, run, args.commit_ops))
        system.clean()  # the wake-ups scheduled an hour ahead must not reach the workers
    live = [name for name in ("lateness", "burst", "immediate") if name in args.scenarios]
    if live and runs:
        run_live(column, args, logs, live, runs)


def run_live(
    column: Column, args: argparse.Namespace, logs: Path, live: list[str], runs: range
) -> None:
    from bench import faults
    from bench.peers.models import Run

    system = column.system
    errors = tempfile.mkdtemp(prefix="bench-peers-")
    processes = system.start(errors, logs / f"{system.name}.log")
    patience = PATIENCE.get(system.name, DEFAULT_PATIENCE)
    try:
        if not warm_up(system):
            column.errors["workers never ran a task"] += 1
            return
        hogs = start_hogs(args.hog)
        try:
            run_rounds(column, system, args, live, patience, runs)
        finally:
            stop_hogs(hogs)
    finally:
        if not wait_for(system.drained, timeout=DEFAULT_PATIENCE, interval=0.5):
            column.notes.append(
                f"work still queued or due {DEFAULT_PATIENCE:g} s after the last run"
            )
        for problem in System.stop(processes):
            column.errors["worker process"] += 1
            column.notes.append(problem)
        time.sleep(scenarios.SETTLE)
        late = Run.objects.filter(system=system.system).delete()[0]
        column.errors["ran after its scenario ended"] += late
        column.errors["failed (as the system reports)"] += system.failures()
        recorded = faults.read(errors)
        column.errors["ERROR logged by a worker"] += len(recorded)
        for row in recorded[:3]:
            column.notes.append(f"{row['source']}: {row['kind']}: {row['message'][-300:]}")
        shutil.rmtree(errors, ignore_errors=True)
        system.clean()


#: A CPU hog: a process that only burns CPU, at the priority of everything else.
HOG = "while True:\n    pass"


def start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    """``--hog``: ``count`` processes that keep a core busy each, for the measured rounds of
    every system alike (started after its warm-up, stopped after its last round)."""
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait()


def run_rounds(
    column: Column,
    system: System,
    args: argparse.Namespace,
    live: list[str],
    patience: float,
    runs: range,
) -> None:
    """The rounds ``runs`` of the live scenarios, each round every scenario once."""
    for run in runs:
        if "lateness" in live:
            outcome = scenarios.lateness(system, run, args.timers, args.spread, patience)
            column.add("lateness", outcome)
        if "burst" in live:
            column.add("burst", scenarios.burst(system, run, args.burst, patience))
        if "immediate" in live:
            outcome = scenarios.immediate(
                system, run, args.immediate, args.immediate_rate, patience
            )
            column.add("immediate", outcome)
        print(f"{system.name}: run {run + 1} of {args.runs} done", flush=True)


def render(columns: list[Column], args: argparse.Namespace) -> None:
    def cell(column: Column, name: str, fmt: str) -> str:
        if column.skipped:
            return "skipped"
        value = column.median(name)
        return "n/a" if value is None else fmt.format(value)

    def errors(column: Column) -> str:
        if column.skipped:
            return "skipped"
        total = sum(column.errors.values())
        if not total:
            return "0"
        parts = ", ".join(f"{n} {kind}" for kind, n in sorted(column.errors.items()) if n)
        return f"**{total}** ({parts})"

    rows = [
        (
            f"lateness p50 ms ({args.timers} timers over {args.spread:g} s)",
            "lateness p50",
            "{:.0f}",
        ),
        ("lateness p99 ms", "lateness p99", "{:.0f}"),
        (f"burst: {args.burst} due at once, tasks/s", "burst rate", "{:.0f}"),
        (
            f"immediate: {args.immediate} at {args.immediate_rate:g}/s, enqueue -> task p50 ms "
            "(durable_agent: gate.schedule now)",
            "immediate p50",
            "{:.1f}",
        ),
        ("immediate p99 ms", "immediate p99", "{:.1f}"),
        ("durable_agent: submit() -> agent p50 ms", "immediate submit p50", "{:.1f}"),
        ("durable_agent: submit() -> agent p99 ms", "immediate submit p99", "{:.1f}"),
        ("commit + wake-up / bare, p50 (durable_agent: new host)", "commit new ratio", "{:.2f}x"),
        ("durable_agent: an earlier wake-up", "commit earlier ratio", "{:.2f}x"),
        ("durable_agent: a later wake-up (coalesces)", "commit later ratio", "{:.2f}x"),
        ("bare transaction p50 ms", "commit bare ms", "{:.2f}"),
    ]
    body = [[label] + [cell(c, name, fmt) for c in columns] for label, name, fmt in rows]
    body.append(["errors"] + [errors(c) for c in columns])
    table(
        f"Side by side, 2 workers each, median of {args.runs} run(s)"
        + (f", {args.hog} CPU hogs running" if args.hog else "")
        + f" ({machine()})",
        ["scenario"] + [c.system.name for c in columns],
        body,
    )
    for name, label in (("burst rate", "burst tasks/s"), ("immediate p50", "immediate p50 ms")):
        runs = [
            f"{c.system.name} " + ", ".join(f"{v:.1f}" for v in c.figures[name])
            for c in columns
            if c.figures.get(name)
        ]
        if runs:
            print(f"- {label}, each run in order: " + "; ".join(runs))
    for column in columns:
        if column.skipped:
            print(f"- {column.system.name}: skipped: {column.skipped}")
        for note in dict.fromkeys(column.notes):
            print(f"- {column.system.name}: {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=list(FACTORIES), default=list(FACTORIES))
    parser.add_argument("--timers", type=int, default=500)
    parser.add_argument("--spread", type=float, default=20.0)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--commit-ops", type=int, default=300)
    parser.add_argument("--immediate", type=int, default=200, help="immediate tasks per run")
    parser.add_argument("--immediate-rate", type=float, default=20.0, help="their rate per second")
    parser.add_argument(
        "--hog",
        type=int,
        default=0,
        help="CPU hogs (busy processes) running through every system's measured rounds",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="run round after round, every system once a round (each started, warmed up and "
        "stopped for its round), so that the machine's drift meets every system alike",
    )
    parser.add_argument(
        "--scenarios",
        nargs="+",
        choices=["lateness", "burst", "commit", "immediate"],
        default=["lateness", "burst", "commit", "immediate"],
    )
    args = parser.parse_args()
    started = time.monotonic()
    setup()
    logs = Path(tempfile.mkdtemp(prefix="bench-peers-logs-"))
    columns = [Column(system) for system in build(args.only)]
    # durable_agent runs last: any of its alarms still armed would be fired (and its hosts
    # swept) by the django-q2 columns' clusters, which share its Schedule table.
    ordered = sorted(columns, key=lambda c: isinstance(c.system, DurableAgent))
    if args.interleave:  # every system's commit scenario first, then round after round
        for column in ordered:
            run_system(column, args, logs, range(0))
        segments = [(c, range(r, r + 1), False) for r in range(args.runs) for c in ordered]
    else:
        segments = [(c, range(args.runs), True) for c in ordered]
    for column, runs, commit in segments:
        began = time.monotonic()
        run_system(column, args, logs, runs, commit=commit)
        print(f"{column.system.name}: {time.monotonic() - began:.0f} s", flush=True)
    render(columns, args)
    print(f"\ntotal {time.monotonic() - started:.0f} s; worker logs in {logs}")


if __name__ == "__main__":
    main()
