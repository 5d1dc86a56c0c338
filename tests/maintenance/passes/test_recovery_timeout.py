"""Recovery reads of the runtime are bounded by ``RECOVERY_TIMEOUT_MS`` (docs/pass.md,
"A recovery read that does not return").

The reads block on an ``Event`` on real threads, so the timeout is real time: it is set to
200 ms (1 s in one test) and each hung read would block 20 s. Every firing goes through
django-q's own scheduler (``tests.qdrive``); the pool needs its own connections, hence
``transaction=True``.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from durable_agent.models import Host, RecoveryFault
from durable_agent.runtime import RecoverySweep
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.qdrive import fire_due, next_armed

pytestmark = [pytest.mark.threads, pytest.mark.django_db(transaction=True)]
US = timedelta(microseconds=1)
HUNG_S = 20  # how long a hung read blocks unless released


@pytest.fixture(autouse=True)
def _short_recovery_timeout(settings: Any) -> None:
    settings.DURABLE_AGENT = {**(settings.DURABLE_AGENT or {}), "RECOVERY_TIMEOUT_MS": 200}


def fire(clock: FakeClock) -> float:
    """Move the clock just past the armed slot, let django-q fire it; return the real seconds
    the firing took."""
    due = next_armed()
    assert due is not None, "no alarm armed"
    if due >= clock.now():
        clock.set(due + US)
    began = time.monotonic()
    fire_due(clock)
    return time.monotonic() - began


def settle_faults(clock: FakeClock, host: Host) -> None:
    for _ in range(10):
        if not RecoveryFault.objects.filter(host=host).exists():
            return
        fire(clock)
    raise AssertionError("the recovery fault did not clear")


def test_read_abort_intent__a_hung_read_faults_its_thread_with_timeout_and_others_settle(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    """A hung abort-intent read is cut off at the recovery timeout: the pass returns, its
    thread gets a recovery fault with reason ``timeout`` and operation ``read abort intent``
    retried 5 s later, and work on another thread settles in the same pass; once the read
    answers again, the retry clears the fault and the thread's work runs (docs/pass.md,
    "A recovery read that does not return")."""
    hung = runtime.submit(host, "a")
    other = runtime.submit(host, "b")
    release = threading.Event()
    reads: list[str] = []
    original = runtime.read_abort_intent

    def read_abort_intent(host: Any, submission: str) -> object | None:
        reads.append(submission)
        if submission == hung.submission:
            release.wait(HUNG_S)
        return original(host, submission)

    runtime.read_abort_intent = read_abort_intent  # type: ignore[method-assign]
    try:
        elapsed = fire(clock)
        assert not release.is_set()
        assert elapsed < HUNG_S / 2, f"the pass waited {elapsed:.1f} s for the hung read"
        assert other.settled
        assert other.outcome == "completed"
        assert not hung.settled
        assert hung.attempts == 0
        fault = RecoveryFault.objects.get(host=host)
        assert fault.thread == "a"
        assert fault.failure["reason"] == "timeout"
        assert fault.failure["operation"] == "read abort intent"
        assert fault.failure["phase"] == "recovery"
        assert fault.attempts == 1
        assert fault.retry_at == fault.last_failed_at + timedelta(seconds=5)
        assert fault.recipients == [hung.submission]
    finally:
        release.set()
    settle_faults(clock, host)
    assert hung.settled
    assert hung.outcome == "completed"
    assert hung.settlements == 1


def test_run_recovery__a_hung_sweep_in_an_attempt_faults_with_timeout_and_others_settle(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime, settings: Any
) -> None:
    """A hung recovery read in a head's attempt is cut off at the recovery timeout: the head
    is not processed, its thread gets a recovery fault with reason ``timeout`` and operation
    ``run recovery``, the other thread's head settles in the same pass, and the retry 5 s
    later clears the fault once the read answers (docs/pass.md, "A recovery
    read that does not return")."""
    # The two attempts run side by side, and SQLite's in-memory test database refuses a read
    # of a table another connection is writing ("database table is locked") instead of
    # waiting. So b's sweep starts only once a's has (a has read its cursor and writes nothing
    # until its timeout), and b gets three seconds to write before a's timeout records the
    # fault. Without that order a loaded CI machine failed the pass in a's cursor read.
    settings.DURABLE_AGENT = {**settings.DURABLE_AGENT, "RECOVERY_TIMEOUT_MS": 3000}
    hung = runtime.submit(host, "a")
    other = runtime.submit(host, "b")
    release, a_sweeping = threading.Event(), threading.Event()
    b_waited: list[bool] = []

    def hang(cursor: str | None) -> RecoverySweep:
        a_sweeping.set()
        release.wait(HUNG_S)
        return RecoverySweep()

    def after_a(cursor: str | None) -> RecoverySweep:
        b_waited.append(a_sweeping.wait(HUNG_S / 4))
        return RecoverySweep()

    runtime.script_recovery(host, "a", hang)
    runtime.script_recovery(host, "b", after_a)
    try:
        elapsed = fire(clock)
        assert b_waited == [True], "b's sweep did not see a's start"
        assert not release.is_set()
        assert elapsed < HUNG_S / 2, f"the pass waited {elapsed:.1f} s for the hung read"
        assert other.settled
        assert other.outcome == "completed"
        assert not hung.settled
        assert hung.attempts == 0
        fault = RecoveryFault.objects.get(host=host)
        assert (fault.thread, fault.attempts) == ("a", 1)
        assert fault.failure["reason"] == "timeout"
        assert fault.failure["operation"] == "run recovery"
        assert fault.retry_at == fault.last_failed_at + timedelta(seconds=5)
    finally:
        release.set()
    settle_faults(clock, host)
    assert hung.settled
    assert hung.settlements == 1
    assert next_armed() is None


def test_run_recovery__a_hung_backlog_sweep_is_abandoned_and_its_late_answer_discarded(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    """Old-work recovery of a thread whose read hangs is cut off at the recovery timeout with a
    ``timeout`` fault (operation ``run recovery``); the abandoned read's late answer is
    discarded (no work cursor is saved from it, the fault stays), and the retry sweeps the
    thread afresh and clears the fault (docs/pass.md, "A recovery
    read that does not return").

    No other thread has work here: SQLite's in-memory test database refuses a second writer
    outright ("database table is locked") instead of waiting, and the pass's main thread
    writes while old-work recovery runs; the tests above show other threads settling."""
    from durable_agent.models import WorkCursor

    stuck = runtime.submit(host, "c", state="running")  # not eligible: old-work recovery
    release, returned = threading.Event(), threading.Event()

    def hang(cursor: str | None) -> RecoverySweep:
        release.wait(HUNG_S)
        returned.set()
        return RecoverySweep(cursor="page-2")

    runtime.script_recovery(host, "c", hang)
    try:
        elapsed = fire(clock)
        assert not release.is_set()
        assert elapsed < HUNG_S / 2, f"the pass waited {elapsed:.1f} s for the hung read"
        fault = RecoveryFault.objects.get(host=host)
        assert fault.thread == "c"
        assert fault.failure["reason"] == "timeout"
        assert fault.failure["operation"] == "run recovery"
        assert fault.recipients == [stuck.submission]
    finally:
        release.set()
    assert returned.wait(HUNG_S)
    assert not WorkCursor.objects.filter(host=host).exists()
    assert RecoveryFault.objects.get(host=host).failure["reason"] == "timeout"
    settle_faults(clock, host)
    assert runtime.calls.count(("run_recovery", "c", "None")) == 2  # the retry starts afresh
