"""The caught-up pass: time and queries with 10 and with 100 000 nonterminal submissions.

    python -m bench.caught_up [--passes 300] [--sizes 10 100000]

The submissions are suspended (waiting for approval): a stable wait the first pass
acknowledges, after which every pass takes the O(1) caught-up path and must not scan them.
"""

from __future__ import annotations

import argparse
import time

from bench.common import machine, reset, setup, summary, table


def seed(host, count: int) -> None:  # type: ignore[no-untyped-def]
    from durable_agent import clock
    from durable_agent.models import Submission, Thread

    now = clock.now()
    threads = Thread.objects.bulk_create(
        [Thread(host=host, key=f"t{i}", created_at=now) for i in range(max(1, count // 10))]
    )
    batch = []
    for i in range(count):
        batch.append(
            Submission(
                host=host,
                thread=threads[i % len(threads)],
                sequence=i // len(threads) + 1,
                agent="bench",
                agent_version="1",
                payload={},
                idempotency_key=f"k{i}",
                state="suspended",
                approval_reason="bench",
                created_at=now,
                updated_at=now,
            )
        )
        if len(batch) == 5000:
            Submission.objects.bulk_create(batch)
            batch = []
    Submission.objects.bulk_create(batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=300)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100_000])
    args = parser.parse_args()
    setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from durable_agent.maintenance import run_pass
    from durable_agent.models import Host

    rows = []
    for size in args.sizes:
        reset()
        host = Host.objects.create(key=f"caught-up-{size}")
        seed(host, size)
        with connection.cursor() as cursor:  # settle the bulk load: no autovacuum mid-run
            cursor.execute("VACUUM ANALYZE")
        first = run_pass(host)  # classifies the waits and acknowledges them
        for _ in range(20):  # warm caches and connections alike for every size
            run_pass(host)
        timings = []
        with CaptureQueriesContext(connection) as captured:
            report = run_pass(host)
        assert report.phase == "caught-up", report
        for _ in range(args.passes):
            started = time.perf_counter()
            report = run_pass(host)
            timings.append((time.perf_counter() - started) * 1000)
            assert report.phase == "caught-up"
        s = summary(timings)
        rows.append([size, first.phase, len(captured), s["p50"], s["p99"]])
    base = rows[0][3]
    for row in rows:
        row.append(row[3] / base)
    table(
        f"Caught-up pass ({args.passes} passes each; {machine()})",
        ["nonterminal submissions", "first pass", "queries", "p50 ms", "p99 ms", "p50 / first"],
        rows,
    )


if __name__ == "__main__":
    main()
