"""The benchmarks' clock lane: its handler records when it starts (bench/lateness.py).

With ``BENCH_HANDLER_DIR`` set, each call appends ``<host id> <start> <cluster>`` (the start in
epoch seconds, the cluster the ``BENCH_CLUSTER`` of its process) to a file of that directory
named after the process and thread; without it the handler does nothing.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime
from typing import Any

from durable_agent import lanes


def record_start(ctx: Any) -> datetime | None:
    started = time.time()
    directory = os.environ.get("BENCH_HANDLER_DIR")
    if directory:
        name = os.path.join(directory, f"{os.getpid()}-{threading.get_ident()}.log")
        with open(name, "a") as out:
            out.write(f"{ctx.host.pk} {started} {os.environ.get('BENCH_CLUSTER', '0')}\n")
    return None


lanes.register("bench-clock", record_start)
