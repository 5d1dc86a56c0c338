"""Immediate work on a live cluster: from the producer's call to the work's first line.

    python -m bench.immediate [--runs 3] [--rate 20] [--count 200]
                              [--scenarios hosts shared schedule approval]
                              [--profile 20] [--py-spy out.txt] [--workers 2]

One client (this process) calls, ``--rate`` times a second, each call in its own committed
transaction, on a live ``manage.py qcluster`` (``AlarmBroker``, two workers, the bench
settings) over its own database (``BENCH_DATABASE_URL``, default ``durable_agent_bench_immediate``,
dropped and created afresh). Scenarios, ``--count`` calls each:

- ``hosts``: ``durable_agent.submit()`` of the trivial agent ``bench-immediate`` to a host of
  its own (each host created and caught up by its first-use pass beforehand); latency = the
  agent function's first line minus the moment ``submit()`` returned;
- ``shared``: the same on one host, the submissions going round-robin to 20 of its threads;
- ``schedule``: ``gate.schedule(host, "bench-clock", now)`` on a host of its own; latency =
  the lane handler's first line minus the moment ``schedule`` returned;
- ``delayed``: ``durable_agent.submit(..., not_before=...)`` to a host of its own, the delay
  going round ``DELAYS`` (0.1 s to 2 s); latency = the agent function's first line minus the
  ``not_before`` it was given (the delayed work's lateness, to compare with bench.lateness);
- ``approval``: ``count`` submissions of ``bench-approval`` (a host each) are first made and
  left to suspend for approval; then each is approved at the rate; latency = the agent's
  line after ``ctx.suspend_for_approval`` (its resumed run) minus the moment ``approve()``
  returned.

Each cell is the median over ``--runs`` runs (a fresh cluster and fresh hosts per run, warmed
up by ``WARM_UP`` unmeasured submissions, as bench.peers warms up every system) of the run's
p50 and p99. Every error is counted and shown, nothing is retried: a call that raised,
work that never started (``missing``) or started twice (``duplicate``), a failed pass
(``PassRecord.phase`` failed), a task django-q reports as failed, an ERROR the cluster logged
(bench/faults.py).

``--profile N`` (default 20, 0 to skip) then runs ``N`` fresh submissions (a host each, 0.5 s
apart, so no two passes overlap) on a cluster traced by ``bench/trace.py``, and prints where
the time between ``submit()`` returning and the agent's first line goes (stage by stage, the
median over the passes), the spans of the pass, and the statements, commits and connection
health checks of ``submit()`` and of the pass, by transaction. ``--py-spy out.txt`` samples
the traced cluster with py-spy meanwhile (``raw`` collapsed stacks; ``.svg``: a flame graph).

Two experiments, not recommended settings: ``--health-checks off`` runs every process without
``CONN_HEALTH_CHECKS`` (what the ``SELECT 1`` before the first query of each piece of work
costs); ``--synchronous-commit off`` sets it on the bench database (what waiting for the WAL
flush of each writing commit costs).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Its own database unless told otherwise: other benchmarks may run beside it.
os.environ.setdefault(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/durable_agent_bench_immediate"
)

from bench.common import cluster, machine, percentile, reset, setup, table, wait_for

THREADS = 20  # the shared scenario's threads on its one host
SETTLE = 1.0  # seconds to wait after the last start, for a late duplicate
PATIENCE = 30.0  # seconds after the last call before missing work counts as missing
WARM_UP = 6  # unmeasured submissions before the scenarios, so that every worker ran a pass
SCENARIOS = {
    "hosts": "submit() -> agent, a host per submission",
    "shared": f"submit() -> agent, {THREADS} threads of one host",
    "schedule": "gate.schedule(now) -> lane handler",
    "approval": "approve() -> agent resumes",
    "delayed": "submit(not_before) -> agent, lateness past not_before",
}
DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0)  # seconds: the delayed scenario's not_before, in turn


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    lag_ms: float = 0.0  # how far behind its schedule the client fell, at worst


def paced(count: int, rate: float, call: Callable[[int], None], outcome: Outcome) -> None:
    """Call ``call(i)`` for i in range(count), the i-th at ``start + i / rate``."""
    start = time.monotonic() + 0.05
    for i in range(count):
        due = start + i / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        else:
            outcome.lag_ms = max(outcome.lag_ms, (now - due) * 1000)
        call(i)


def read_stamps(directory: str, prefix: str) -> dict[str, list[tuple[str, float]]]:
    """``<key> <what> <epoch>`` (agents) or ``<key> <epoch> <cluster>`` (the clock lane)."""
    stamps: dict[str, list[tuple[str, float]]] = defaultdict(list)
    pattern = "agent-*.log" if prefix == "agent" else "[0-9]*.log"  # bench/benchapp/lanes.py
    for path in Path(directory).glob(pattern):
        for line in path.read_text().splitlines():
            parts = line.split()
            if prefix == "agent":
                stamps[parts[0]].append((parts[1], float(parts[2])))
            else:
                stamps[parts[0]].append(("start", float(parts[1])))
    return stamps


def make_hosts(prefix: str, count: int) -> list[int]:
    from durable_agent.maintenance import run_pass
    from durable_agent.models import Host

    hosts = Host.objects.bulk_create([Host(key=f"{prefix}-{i}") for i in range(count)])
    for host in hosts:  # the first-use pass: each host caught up before the bench
        run_pass(host)
    return [int(h.pk) for h in hosts]


def call_counted(outcome: Outcome, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # counted, never retried
        outcome.errors[f"call raised {type(exc).__name__}"] += 1
        return None


def run_submit(
    shared: bool, count: int, rate: float, stamps_dir: str, run: int, delayed: bool = False
) -> Outcome:
    from datetime import timedelta

    from django.utils import timezone

    import durable_agent

    outcome = Outcome()
    kind = "d" if delayed else "s" if shared else "h"
    hosts = make_hosts(f"i{run}-{kind}", 1 if shared else count)
    returned: dict[str, float] = {}

    def call(i: int) -> None:
        host = hosts[0] if shared else hosts[i]
        thread = f"t{i % THREADS}" if shared else "t"
        at = timezone.now() + timedelta(seconds=DELAYS[i % len(DELAYS)]) if delayed else None
        receipt = call_counted(
            outcome,
            lambda: durable_agent.submit(
                host=host, thread=thread, agent="bench-immediate", payload={"i": i}, not_before=at
            ),
        )
        if receipt is not None:  # delayed: measured from not_before, not from the return
            returned[str(receipt.submission_id)] = at.timestamp() if at else time.time()

    paced(count, rate, call, outcome)
    collect(outcome, returned, stamps_dir, "agent", "start")
    return outcome


def run_schedule(count: int, rate: float, stamps_dir: str, run: int) -> Outcome:
    from django.utils import timezone

    from durable_agent.maintenance import gate

    outcome = Outcome()
    hosts = make_hosts(f"i{run}-g", count)
    returned: dict[str, float] = {}

    def call(i: int) -> None:
        at = call_counted(
            outcome, lambda: (gate.schedule(hosts[i], "bench-clock", timezone.now()), time.time())
        )
        if at is not None:
            returned[str(hosts[i])] = at[1]

    paced(count, rate, call, outcome)
    collect(outcome, returned, stamps_dir, "handler", "start")
    return outcome


def run_approval(count: int, rate: float, stamps_dir: str, run: int) -> Outcome:
    import durable_agent
    from durable_agent.models import Submission

    outcome = Outcome()
    hosts = make_hosts(f"i{run}-a", count)
    ids: list[int] = []
    for host in hosts:
        receipt = call_counted(
            outcome,
            lambda host=host: durable_agent.submit(
                host=host, thread="t", agent="bench-approval", payload={}
            ),
        )
        if receipt is not None:
            ids.append(receipt.submission_id)
    suspended = Submission.objects.filter(pk__in=ids, state="suspended")
    if not wait_for(lambda: suspended.count() == len(ids), timeout=PATIENCE, interval=0.2):
        outcome.errors["never suspended"] += len(ids) - suspended.count()
    time.sleep(SETTLE)  # the passes that suspended them have finished
    ready = list(suspended.values_list("pk", flat=True))
    returned: dict[str, float] = {}

    def call(i: int) -> None:
        if i >= len(ready):
            return
        status = call_counted(outcome, lambda: durable_agent.approve(ready[i], actor="bench"))
        if status is not None:
            returned[str(ready[i])] = time.time()

    paced(count, rate, call, outcome)
    collect(outcome, returned, stamps_dir, "agent", "resumed")
    return outcome


def collect(
    outcome: Outcome, returned: dict[str, float], stamps_dir: str, prefix: str, what: str
) -> None:
    """Wait for every start, then count the latencies, the missing and the duplicates."""

    def starts() -> dict[str, list[float]]:
        found: dict[str, list[float]] = defaultdict(list)
        for key, rows in read_stamps(stamps_dir, prefix).items():
            found[key] = [t for w, t in rows if w == what]
        return found

    wait_for(
        lambda: sum(1 for key in returned if starts().get(key)) >= len(returned),
        timeout=PATIENCE,
        interval=0.2,
    )
    time.sleep(SETTLE)
    found = starts()
    for key, at in returned.items():
        times = found.get(key, [])
        if not times:
            outcome.errors["missing"] += 1
            continue
        outcome.errors["duplicate"] += len(times) - 1
        outcome.latencies.append((min(times) - at) * 1000)


def by_delay(outcome: Outcome) -> None:
    """The delayed scenario's lateness for each delay (latencies are in call order)."""
    if outcome.errors["missing"]:
        return  # the order no longer tells the delays apart
    for k, delay in enumerate(DELAYS):
        shown = outcome.latencies[k :: len(DELAYS)]
        print(
            f"  not_before +{delay:g} s: p50 {percentile(shown, 50):.1f} ms "
            f"p99 {percentile(shown, 99):.1f} ms",
            flush=True,
        )


def cluster_errors(outcome: Outcome, exc: SystemExit) -> None:
    match = re.search(r"recorded (\d+) errors", str(exc))
    outcome.errors["ERROR logged by the cluster"] += int(match.group(1)) if match else 1


def pass_errors(outcome: Outcome) -> None:
    from django_q.models import Task

    from durable_agent.models import PassRecord

    outcome.errors["failed pass"] += PassRecord.objects.filter(phase="failed").count()
    outcome.errors["failed task"] += Task.objects.filter(success=False).count()


def warm_up(stamps_dir: str, run: int) -> None:
    """Submit ``WARM_UP`` fresh submissions 0.1 s apart and wait for their agents: every worker
    has run a pass (its pool threads and their connections exist), as the peers' warm-up
    (``bench/peers``) does for theirs. Every other one is delayed by 0.2 s, so that the alarm's
    path (a slot fired ahead, the held start) is warm too, not only the prompt start: the
    delayed scenario's first passes otherwise took 100 ms. Not measured; a warm-up that never
    starts stops the run."""
    from datetime import timedelta

    import durable_agent

    ids = []
    for i, host in enumerate(make_hosts(f"i{run}-w", WARM_UP)):
        delay = timedelta(seconds=0.2) if i % 2 else None
        ids.append(
            str(
                durable_agent.submit(
                    host=host,
                    thread="t",
                    agent="bench-immediate",
                    payload={"i": i},
                    not_before=delay,
                ).submission_id
            )
        )
        time.sleep(0.1)
    started = wait_for(
        lambda: all(read_stamps(stamps_dir, "agent").get(k) for k in ids),
        timeout=PATIENCE,
        interval=0.1,
    )
    if not started:
        raise SystemExit("the warm-up submissions never started")


def run_all(args: argparse.Namespace, run: int) -> dict[str, Outcome]:
    from durable_agent.models import PassRecord

    reset()
    stamps = tempfile.mkdtemp(prefix="bench-immediate-")
    results: dict[str, Outcome] = {}
    env = {"BENCH_HANDLER_DIR": stamps, "Q_WORKERS": str(args.workers)}
    try:
        with cluster(workers=args.workers, env=env):
            time.sleep(4)  # let the cluster start
            warm_up(stamps, run)
            for scenario in args.scenarios:
                PassRecord.objects.all().delete()
                if scenario == "hosts":
                    outcome = run_submit(False, args.count, args.rate, stamps, run)
                elif scenario == "shared":
                    outcome = run_submit(True, args.count, args.rate, stamps, run)
                elif scenario == "delayed":
                    outcome = run_submit(False, args.count, args.rate, stamps, run, delayed=True)
                elif scenario == "schedule":
                    outcome = run_schedule(args.count, args.rate, stamps, run)
                else:
                    outcome = run_approval(args.count, args.rate, stamps, run)
                pass_errors(outcome)
                results[scenario] = outcome
                if scenario == "delayed":
                    by_delay(outcome)
                print(
                    f"run {run + 1} {scenario}: p50 {percentile(outcome.latencies, 50):.1f} ms "
                    f"p99 {percentile(outcome.latencies, 99):.1f} ms, "
                    f"errors {sum(outcome.errors.values())}",
                    flush=True,
                )
    except SystemExit as exc:  # bench.common.cluster: the cluster logged errors
        last = results.get(args.scenarios[-1]) or results.setdefault("cluster", Outcome())
        cluster_errors(last, exc)
    finally:
        shutil.rmtree(stamps, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scenarios", nargs="*", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--profile", type=int, default=20, help="traced submissions (0: none)")
    parser.add_argument("--py-spy", help="sample the traced cluster with py-spy into this file")
    parser.add_argument(
        "--health-checks",
        choices=["on", "off"],
        default="on",
        help="the cluster's CONN_HEALTH_CHECKS (an experiment: off is not the recommended setting)",
    )
    parser.add_argument(
        "--synchronous-commit",
        choices=["on", "off"],
        default="on",
        help="the bench database's synchronous_commit (an experiment: what the WAL flushes cost)",
    )
    args = parser.parse_args()
    os.environ["BENCH_HEALTH_CHECKS"] = "1" if args.health_checks == "on" else "0"
    setup()
    if args.synchronous_commit == "off":
        from django.db import connection

        with connection.cursor() as cursor:  # every later connection of the bench database
            cursor.execute(
                f'ALTER DATABASE "{connection.settings_dict["NAME"]}" SET synchronous_commit = off'
            )
        connection.close()
    runs = [run_all(args, run) for run in range(args.runs)] if args.scenarios else []
    rows = []
    for scenario in args.scenarios:
        outcomes = [r[scenario] for r in runs if scenario in r]
        errors: Counter[str] = Counter()
        for o in outcomes:
            errors.update(o.errors)
        shown = ", ".join(f"{n} {k}" for k, n in sorted(errors.items()) if n) or "0"
        rows.append(
            [
                SCENARIOS[scenario],
                f"{args.count} at {args.rate:g}/s",
                statistics.median(percentile(o.latencies, 50) for o in outcomes),
                statistics.median(percentile(o.latencies, 99) for o in outcomes),
                statistics.median(max(o.latencies, default=float("nan")) for o in outcomes),
                max(o.lag_ms for o in outcomes),
                shown,
            ]
        )
    if rows:
        table(
            f"Immediate work, median of {args.runs} runs, {args.workers} workers ({machine()})",
            ["scenario", "calls", "p50 ms", "p99 ms", "max ms", "client lag ms", "errors"],
            rows,
        )
    if args.profile:
        from bench.immediate_profile import run_profile

        run_profile(args)


if __name__ == "__main__":
    main()
