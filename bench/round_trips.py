"""What a round trip to PostgreSQL costs hot and after a pause, as the prompt start meets it.

    python -m bench.round_trips [--count 300] [--pause-ms 50] [--hosts 200]

At 20 submissions a second a worker waits about 50 ms between passes, and every round trip of
a prompt pass then starts on an idle client and an idle server process. This measures, on one
persistent connection of this process to the bench database: a ``SELECT 1`` (Django's
connection health check), and an alarm transaction's first steps, the host's lock and read in
one call (``BEGIN``, ``durable_agent_lock_and_read``, ``ROLLBACK``) on one of ``--hosts``
caught-up hosts (their first-use pass run). Each is called ``--count`` times right after
another call ("hot") and ``--count`` times after a ``--pause-ms`` sleep ("after a pause"),
the two interleaved so that a drift of the machine affects both. Times are the client's wall
clock around the call.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from bench.common import machine, reset, setup, summary, table


def measure(name: str, call: Callable[[], None], count: int, pause: float) -> list[object]:
    hot: list[float] = []
    paused: list[float] = []
    for i in range(count * 2):
        after_pause = i % 2 == 1
        if after_pause:
            time.sleep(pause)
        started = time.perf_counter()
        call()
        (paused if after_pause else hot).append((time.perf_counter() - started) * 1000)
    h, p = summary(hot), summary(paused)
    return [name, count, h["p50"], h["p99"], p["p50"], p["p99"], p["p50"] / h["p50"]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--pause-ms", type=float, default=50.0)
    parser.add_argument("--hosts", type=int, default=200)
    args = parser.parse_args()
    setup()
    from django.db import connection, transaction

    from bench.lateness import prepare
    from durable_agent.maintenance.store import rows

    reset()
    hosts = prepare(args.hosts)
    rng = random.Random(7)

    def health_check() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    def lock_and_read() -> None:
        with transaction.atomic():
            if rows.lock_and_read(rng.choice(hosts)) is None:
                raise SystemExit("the lock and read found no state row")
            transaction.set_rollback(True)

    for _ in range(20):  # warm the connection and the prepared statements
        health_check()
        lock_and_read()
    pause = args.pause_ms / 1000
    table(
        f"A round trip hot and after a {args.pause_ms:g} ms pause, one connection ({machine()})",
        [
            "what",
            "calls each",
            "hot p50 ms",
            "hot p99 ms",
            "after a pause p50 ms",
            "after a pause p99 ms",
            "after a pause / hot (p50)",
        ],
        [
            measure("SELECT 1 (one round trip)", health_check, args.count, pause),
            measure(
                "BEGIN, lock and read, ROLLBACK (three round trips)",
                lock_and_read,
                args.count,
                pause,
            ),
        ],
    )


if __name__ == "__main__":
    main()
