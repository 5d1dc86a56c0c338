"""submit() -> settled on SQLite, the embedded default: a live cluster without prompt hints.

    python -m bench.sqlite_submit [--runs 4] [--count 60] [--interval 0.25]

Each run: a fresh SQLite database in a temporary directory, migrated; a live
``manage.py qcluster`` (the example project's settings, two workers, ``AlarmBroker``); then
``--count`` submissions of the example project's ``summarise`` agent, each to a host of its
own, ``--interval`` seconds apart. Latency = the submission's ``settled_at`` minus the moment
``submit()`` returned. SQLite has no notifications between processes, so the slot, armed the
minimum alarm delay after the commit and found by the broker's 0.1 s probe, starts every pass
(docs/deployment.md "Prompt start"). Every error is counted and shown, nothing is retried: a
submission not settled within 60 s, an outcome other than ``completed``, an ERROR line of the
cluster.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVER = """
import json, sys, time
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
print("migrated", flush=True)
sys.stdin.readline()  # the cluster is running
import durable_agent
from durable_agent.models import Host, Submission
count, interval = int(sys.argv[1]), float(sys.argv[2])
returned = {}
for i in range(count):
    host = Host.objects.create(key=f"sqlite-{i}")
    payload = {"text": "a b"}
    receipt = durable_agent.submit(host=host, thread="t", agent="summarise", payload=payload)
    returned[receipt.submission_id] = time.time()
    time.sleep(interval)
give_up = time.time() + 60
rows = Submission.objects.filter(pk__in=returned)
while rows.exclude(state="settled").exists() and time.time() < give_up:
    time.sleep(0.2)
out = {"latencies": [], "unsettled": 0, "not completed": 0}
for row in rows:
    if row.state != "settled":
        out["unsettled"] += 1
    elif row.outcome != "completed":
        out["not completed"] += 1
    else:
        out["latencies"].append((row.settled_at.timestamp() - returned[row.pk]) * 1000)
print(json.dumps(out), flush=True)
"""


def one_run(count: int, interval: float) -> dict[str, object]:
    import json

    with tempfile.TemporaryDirectory(prefix="bench-sqlite-") as directory:
        env = {**os.environ, "SQLITE_PATH": str(Path(directory) / "db.sqlite3")}
        env.pop("DATABASE_URL", None)
        env["DJANGO_SETTINGS_MODULE"] = "project.settings"
        env["PYTHONPATH"] = str(ROOT)
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(count), str(interval)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert driver.stdin is not None
        assert driver.stdout is not None
        if driver.stdout.readline().strip() != "migrated":
            raise SystemExit("the driver did not migrate")
        log = Path(directory) / "qcluster.log"
        with log.open("w") as out:
            cluster = subprocess.Popen(
                [sys.executable, "manage.py", "qcluster"],
                cwd=ROOT,
                env={**env, "Q_WORKERS": "2"},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            give_up = time.monotonic() + 60
            while "] running." not in log.read_text():
                if time.monotonic() > give_up or cluster.poll() is not None:
                    raise SystemExit("the cluster did not start:\n" + log.read_text()[-2000:])
                time.sleep(0.1)
            driver.stdin.write("go\n")
            driver.stdin.flush()
            result: dict[str, object] = json.loads(driver.stdout.readline())
            driver.wait(30)
        finally:
            os.killpg(cluster.pid, signal.SIGTERM)
            try:
                cluster.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(cluster.pid, signal.SIGKILL)
                cluster.wait()
        result["cluster errors"] = sum(" ERROR " in line for line in log.read_text().splitlines())
        return result


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return (
        ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))] if ordered else float("nan")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    rows = []
    for run in range(args.runs):
        result = one_run(args.count, args.interval)
        latencies = result["latencies"]
        assert isinstance(latencies, list)
        errors = {k: v for k, v in result.items() if k != "latencies" and v}
        rows.append((percentile(latencies, 50), percentile(latencies, 99), errors))
        print(
            f"run {run + 1}: settled {len(latencies)}/{args.count}, p50 {rows[-1][0]:.1f} ms, "
            f"p99 {rows[-1][1]:.1f} ms, errors {errors or 0}",
            flush=True,
        )
    print(
        f"\nsubmit() -> settled on SQLite, median of {args.runs} runs: "
        f"p50 {statistics.median(r[0] for r in rows):.1f} ms, "
        f"p99 {statistics.median(r[1] for r in rows):.1f} ms; "
        f"errors in all runs: {sum(sum(r[2].values()) for r in rows)}"
    )


if __name__ == "__main__":
    main()
