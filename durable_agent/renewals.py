"""Lease renewals that start a thread only when one is due.

``renewing(name, every, renew)`` calls ``renew()`` every ``every`` seconds while its block runs,
from a thread of its own, until ``renew()`` returns False or the block ends. A pass holds its
host's pass lease this way (``maintenance/passes/state.py``) and an agent attempt its
submission's lease (``agents/leases.py``).

Note [A renewal thread starts only when it is due]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Almost every block ends long before its first renewal (a third of the pass lease's TTL, the
agent lease's renewal interval: seconds, against a pass of milliseconds), yet a thread of its
own per block cost every pass a thread start and a join, each a hand-over between threads that
a busy worker pays in scheduling delay (8 % of a worker's samples in a burst's profile). So a
block only registers its first due time with one scheduler thread per process; the scheduler
starts the block's own renewal thread when that time comes, and a block that ends first starts
none. From then on the block's thread renews exactly as a thread of its own per block did: a
renewal that hangs holds up only its own lease, and the block's end waits for an in-flight
renewal (the join), so no renewal runs after the block. The scheduler itself wakes about twice
a renewal interval, not once for every block: a block that ended is dropped from the front of
the line at a timed wake-up, and a new block wakes it only when due before its next wake-up.

The scheduler holds no connection and runs no query; it is started on first use in each
process, and again in a forked child (django-q's workers are forked from the cluster).
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connections


@dataclass
class _Block:
    name: str
    every: float
    renew: Callable[[], bool]
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set() and self.renew():
                if self.stop.wait(self.every):
                    break
        finally:
            connections.close_all()  # this thread's connections only


class _Scheduler:
    """Starts each registered block's thread at its due time, unless the block ended first."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.due: list[tuple[float, int, _Block]] = []
        self.keys = itertools.count()
        self.thread: threading.Thread | None = None
        self.wake_at: float | None = None  # when the scheduler wakes next; None: when told

    def add(self, block: _Block) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self.loop, name="da-lease-renewals", daemon=True
                )
                self.thread.start()
            due = time.monotonic() + block.every
            heapq.heappush(self.due, (due, next(self.keys), block))
            if self.wake_at is None or due < self.wake_at:
                self.lock.notify()

    def end(self, block: _Block) -> None:
        block.stop.set()
        with self.lock:
            thread = block.thread
        if thread is not None:
            thread.join(timeout=block.every + 5)

    def loop(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                timed = bool(self.due) and self.due[0][0] <= now
                while self.due and self.due[0][0] <= now:
                    _, _, block = heapq.heappop(self.due)
                    if not block.stop.is_set():
                        block.thread = threading.Thread(
                            target=block.run, name=block.name, daemon=True
                        )
                        block.thread.start()
                # On a timed wake-up, blocks that ended are dropped from the front of the line
                # whatever their time, and a block due after the next wake-up does not wake the
                # scheduler (``add``): it wakes about twice a renewal interval however many
                # passes run, not once for every pass.
                while timed and self.due and self.due[0][2].stop.is_set():
                    heapq.heappop(self.due)
                self.wake_at = self.due[0][0] if self.due else None
                self.lock.wait(None if self.wake_at is None else self.wake_at - now)


_scheduler = _Scheduler()


def _after_fork_in_child() -> None:
    global _scheduler
    _scheduler = _Scheduler()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def renewing(name: str, every: float, renew: Callable[[], bool]) -> Iterator[None]:
    """Call ``renew()`` every ``every`` seconds while the block runs, from a thread named
    ``name`` started at the first renewal; stop when it returns False. The block's end waits for
    a renewal in flight."""
    block = _Block(name=name, every=every, renew=renew)
    scheduler = _scheduler
    scheduler.add(block)
    try:
        yield
    finally:
        scheduler.end(block)
