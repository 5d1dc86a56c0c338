"""docs/first-agent.md section 14 runs as written: a retried agent, a delayed submission and
``wait``, with passes fired at each alarm's time by a thread standing in for the cluster."""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connections

from durable_agent.maintenance import alarm, run_pass
from durable_agent.models import Host
from tests.package.docs_snippets import ROOT, block

# PostgreSQL: the stand-in cluster writes from its own thread while the block waits, which the
# SQLite test database (one in-memory database, table locks across connections) refuses at
# random ("database table is locked"). On SQLite the same blocks run from the built wheel
# against a real cluster in tests/package.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

GUIDE = ROOT / "docs" / "first-agent.md"


@contextlib.contextmanager
def cluster() -> Iterator[None]:
    """Run each host's pass once its alarm is due, until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        try:
            while not stop.is_set():
                for host in Host.objects.all():
                    due = alarm.scheduled(host)
                    if due is not None and due.timestamp() <= time.time():
                        run_pass(host)
                stop.wait(0.02)
        finally:
            connections.close_all()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def test_guide__retries_a_delayed_submission_and_waits_for_it(db: None) -> None:
    agents = block(GUIDE, starts="# billing/retrying.py")
    script = block(GUIDE, starts="# delayed submission and wait")
    expected = next(
        line.removeprefix("# ") for line in script.splitlines() if line.startswith("# settled")
    )
    Host.objects.create(key="tenant-1")
    exec(compile(agents, "billing/retrying.py", "exec"), {"__name__": "billing.retrying"})
    out = io.StringIO()
    started = time.monotonic()

    with cluster(), contextlib.redirect_stdout(out):
        exec(compile(script, "guide", "exec"), {"__name__": "guide"})

    assert out.getvalue().strip() == expected
    assert time.monotonic() - started >= 2  # not_before=timedelta(seconds=2), never sooner
