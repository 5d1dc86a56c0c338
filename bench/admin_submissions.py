"""The admin's submission list at a million rows.

    python -m bench.admin_submissions [--rows 1000000] [--runs 5]

Loads ``--rows`` submissions in SQL (``INSERT ... SELECT ... generate_series``): 1 000 hosts,
one thread per 10 submissions (sequences 1-10), five agents in turn, nine in ten settled
(one in ten of those failed), the tenth of each thread ready; ``updated_at`` one second apart.
Then ``ANALYZE`` and, through Django's test client logged in as a superuser, the p50 of
``--runs`` requests of each view of the list (after one warm-up), its query count and any
sequential scan of a large table in the plans of its queries (``EXPLAIN``, as
``bench/million.py`` reports them).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import machine, setup, table

HOSTS = 1_000
PER_THREAD = 10
AGENTS = 5


def load(rows: int) -> float:
    from django.db import connection

    started = time.perf_counter()
    threads = rows // PER_THREAD
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO durable_agent_host (key, single_thread, created_at) "
            "SELECT 'h' || lpad(g::text, 7, '0'), false, now() FROM generate_series(1, %s) g",
            [HOSTS],
        )
        cursor.execute(
            "INSERT INTO durable_agent_thread (host_id, key, created_at) "
            "SELECT (SELECT min(id) FROM durable_agent_host) + (g - 1) %% %s, "
            "'t' || lpad(g::text, 8, '0'), now() FROM generate_series(1, %s) g",
            [HOSTS, threads],
        )
        cursor.execute(
            """
            INSERT INTO durable_agent_submission (
                host_id, thread_id, sequence, agent, agent_version, payload, idempotency_key,
                state, outcome, result, error, attempts, side_effect_marked, approvals,
                created_at, updated_at, settled_at)
            SELECT t.host_id, t.id, s.seq, 'agent-' || (s.g %% %s), '1', '{}'::jsonb,
                'k' || lpad(s.g::text, 8, '0'),
                CASE WHEN s.seq = %s THEN 'ready' ELSE 'settled' END,
                CASE WHEN s.seq = %s THEN NULL WHEN s.g %% 10 = 5 THEN 'failed'
                     ELSE 'completed' END,
                NULL, NULL, 1, false, '[]'::jsonb,
                now() - (%s - s.g) * interval '1 second',
                now() - (%s - s.g) * interval '1 second',
                CASE WHEN s.seq = %s THEN NULL ELSE now() - (%s - s.g) * interval '1 second' END
            FROM (SELECT g, 1 + (g - 1) %% %s AS seq, 1 + (g - 1) / %s AS n
                  FROM generate_series(1, %s) g) s
            JOIN durable_agent_thread t
              ON t.id = (SELECT min(id) FROM durable_agent_thread) + s.n - 1
            """,
            [
                AGENTS,
                PER_THREAD,
                PER_THREAD,
                rows,
                rows,
                PER_THREAD,
                rows,
                PER_THREAD,
                PER_THREAD,
                rows,
            ],
        )
        cursor.execute("ANALYZE")
    return time.perf_counter() - started


VIEWS = [
    ("first page", ""),
    ("page 50", "?p=50"),
    ("search a host key", "?q=h0000123"),
    ("search a thread key", "?q=t00012345"),
    ("search an idempotency key", "?q=k00123456"),
    ("search, no match", "?q=nothing-like-it"),
    ("state ready", "?state__exact=ready"),
    ("outcome failed", "?outcome__exact=failed"),
    ("outcome aborted (none)", "?outcome__exact=aborted"),
    ("agent filter", "?agent__exact=agent-3"),
    ("head of its thread", "?head=yes"),
    ("by id", "?o=1"),
]


def measure(runs: int) -> list[list[Any]]:
    from bench.million import _admin_client, _timed_get

    client = _admin_client()
    rows = []
    for name, query in VIEWS:
        seen = _timed_get(client, "/admin/durable_agent/submission/" + query, runs)
        body = seen["response"].content.decode()
        about = "about" if "da-estimated" in body else "exact"
        rows.append([name, seen["queries"], seen["p50"], seen["max"], about, seen["scans"]])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    setup()
    seconds = load(options.rows)
    print(f"{machine()}; loaded {options.rows} submissions in {seconds:.1f} s", flush=True)
    table(
        f"The submission list at {options.rows} rows (p50 of {options.runs} requests)",
        ["view", "queries", "p50 ms", "max ms", "count", "large seq scans"],
        measure(options.runs),
    )


if __name__ == "__main__":
    main()
