"""Lease renewals start a thread only when one is due (Note [A renewal thread starts only when it
is due] in durable_agent/renewals.py)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from durable_agent.agents.leases import LeaseKeeper
from durable_agent.maintenance.passes.state import Lease, heartbeat
from durable_agent.renewals import renewing
from tests.factories import T0


def _threads(name: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == name]


def test_heartbeat__a_pass_that_ends_before_its_first_renewal_starts_no_thread() -> None:
    with heartbeat(Lease(host_id=9101, owner="o", expires_at=T0)):
        time.sleep(0.05)  # a thread started at the block's start would be running by now
        assert _threads("da-lease-9101") == []
    assert _threads("da-lease-9101") == []


def test_lease_keeper__an_attempt_that_ends_before_its_first_renewal_starts_no_thread() -> None:
    keeper = LeaseKeeper(9102, "o")
    with keeper.running():
        time.sleep(0.05)
        assert _threads("da-submission-lease-9102") == []
    assert not keeper.lost.is_set()


def test_renewing__renews_every_interval_from_its_own_thread_until_the_block_ends() -> None:
    calls: list[str] = []

    def renew() -> bool:
        calls.append(threading.current_thread().name)
        return True

    with renewing("da-test-every", 0.03, renew):
        time.sleep(0.2)
        assert _threads("da-test-every")
    seen = len(calls)
    assert 3 <= seen <= 8, calls
    assert set(calls) == {"da-test-every"}
    assert _threads("da-test-every") == []
    time.sleep(0.1)
    assert len(calls) == seen  # nothing after the block


def test_renewing__a_lost_lease_stops_the_renewals() -> None:
    calls: list[float] = []

    def renew() -> bool:
        calls.append(time.monotonic())
        return False

    with renewing("da-test-lost", 0.02, renew):
        time.sleep(0.2)
    assert len(calls) == 1


def test_renewing__the_block_ends_after_a_renewal_in_flight() -> None:
    started, finished = threading.Event(), threading.Event()

    def renew() -> bool:
        started.set()
        time.sleep(0.2)
        finished.set()
        return True

    with renewing("da-test-in-flight", 0.02, renew):
        assert started.wait(5)
    assert finished.is_set()


def test_renewing__blocks_run_side_by_side_each_on_its_own_schedule() -> None:
    counts = {"fast": 0, "slow": 0}

    def counter(key: str) -> object:
        def renew() -> bool:
            counts[key] += 1
            return True

        return renew

    with renewing("da-test-slow", 10.0, counter("slow")):  # type: ignore[arg-type]
        with renewing("da-test-fast", 0.02, counter("fast")):  # type: ignore[arg-type]
            time.sleep(0.15)
    assert counts["fast"] >= 3
    assert counts["slow"] == 0


def _child(queue: multiprocessing.Queue[int]) -> None:
    calls = []
    with renewing("da-test-child", 0.02, lambda: calls.append(1) is None):
        time.sleep(0.2)
    queue.put(len(calls))


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_renewing__works_in_a_child_forked_while_the_scheduler_runs() -> None:
    with renewing("da-test-parent", 0.01, lambda: True):
        time.sleep(0.03)  # the scheduler thread runs in this process
        context = multiprocessing.get_context("fork")
        queue: multiprocessing.Queue[int] = context.Queue()
        child = context.Process(target=_child, args=(queue,))
        child.start()
        renewed = queue.get(timeout=10)
        child.join(timeout=10)
    assert child.exitcode == 0
    assert renewed >= 3


def test_renewing__the_scheduler_sleeps_through_blocks_that_ended() -> None:
    """Three hundred short blocks a millisecond apart wake the scheduler a few times, not once
    each (a burst's passes, each ending long before its first renewal)."""
    from durable_agent import renewals

    scheduler = renewals._scheduler
    with renewing("da-test-warm", 10.0, lambda: True):
        pass  # the scheduler thread runs
    wakes = 0
    original = scheduler.lock.wait

    def counted(timeout: float | None = None) -> bool:
        nonlocal wakes
        wakes += 1
        return original(timeout)

    scheduler.lock.wait = counted  # type: ignore[method-assign]
    try:
        for _ in range(300):
            with renewing("da-test-short", 0.3, lambda: True):
                pass
            time.sleep(0.001)
        time.sleep(0.5)  # every block's time has come
    finally:
        scheduler.lock.wait = original  # type: ignore[method-assign]
    assert wakes < 20, wakes
