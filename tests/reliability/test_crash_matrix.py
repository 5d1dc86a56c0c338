"""The crash matrix: every failpoint x every scenario that passes it, with the reference runtime.

Each case runs a scenario with the failpoint killing the work the first time it is hit (an
exception in-process; a real ``os._exit`` in a child process for the process-death variant).
After the crash the invariant audit passes, and firing alarms until quiet converges with every
accepted submission settled exactly once.

``SCENARIO_FAILPOINTS`` is checked against a dry run: adding a failpoint (or changing which
ones a scenario passes) fails ``test_matrix__covers_every_failpoint`` until the table is
updated, so every failpoint always has its crash cases.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django_q.models import Schedule

import durable_agent
from durable_agent import conf, lanes, tasks
from durable_agent.agents import recovery as agent_recovery
from durable_agent.agents import registry
from durable_agent.errors import AlarmError, PassError, PassFailed
from durable_agent.maintenance import alarm, ensure_alarm, failpoints, gate, run_pass
from durable_agent.maintenance.failpoints import FailpointError
from durable_agent.maintenance.operators.audit import audit_host
from durable_agent.models import Host, MaintenanceState, Submission
from durable_agent.testing import FakeClock
from tests.maintenance.helpers import drain

pytestmark = pytest.mark.django_db

ALL = set(failpoints.LOCATIONS)
PASS = ALL - {
    "maintenance:dirty:before",
    "maintenance:dirty:after",
    "maintenance:mutation:armed",
    "maintenance:mutation:finished",
    "maintenance:ensure:before",
    "maintenance:ensure:after",
    "maintenance:binding-retry:before",
    "maintenance:binding-retry:after",
    "maintenance:recovery-status:before",
    "maintenance:recovery-status:after",
    "maintenance:retry:before",
    "maintenance:retry:after",
}
_keys = itertools.count()
EXECUTIONS: list[int] = []


@pytest.fixture(autouse=True)
def _agents() -> Iterator[None]:
    saved = registry.snapshot()

    def echo(ctx: Any, payload: Any) -> Any:
        EXECUTIONS.append(ctx.submission.pk)
        return payload

    registry.restore({})
    registry.register("echo", echo, version="1", retry_safe=True)
    EXECUTIONS.clear()
    yield
    registry.restore(saved)


def _is_crash(exc: BaseException) -> bool:
    return isinstance(exc, FailpointError) or (
        isinstance(exc, AlarmError) and isinstance(exc.__cause__, FailpointError)
    )


def crashes(fn: Callable[[], Any]) -> None:
    """Run one step; a crash (the failpoint's exception) is the point of the exercise.

    A pass that failed in several places raises them together (``PassFailed``): the crash
    must be one of them.
    """
    try:
        fn()
    except PassFailed as group:
        if not any(_is_crash(exc) for exc in group.exceptions):
            raise
    except (FailpointError, AlarmError) as exc:
        if not _is_crash(exc):
            raise


def submit(host: Host, thread: str = "t1") -> None:
    durable_agent.submit(host=host, thread=thread, agent="echo", payload={"n": next(_keys)})


# -- scenarios: each takes (host, clock) and returns nothing; crashes are caught -------------


def gate_mutation(host: Host, clock: FakeClock) -> None:
    lanes.register("outbox", lambda ctx: None)

    def body() -> None:
        with gate.mutation(host, lanes=("outbox",)):
            gate.schedule(host, "outbox", clock.now())

    crashes(body)
    crashes(lambda: run_pass(host))


def submit_only(host: Host, clock: FakeClock) -> None:
    crashes(lambda: submit(host))


def settling_head(host: Host, clock: FakeClock) -> None:
    crashes(lambda: submit(host))
    crashes(lambda: submit(host, "t2"))
    crashes(lambda: run_pass(host))


def failing_lane(host: Host, clock: FakeClock) -> None:
    calls = [0]

    def flaky(ctx: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("flaky lane")

    lanes.register("outbox", flaky)
    crashes(lambda: submit(host))
    crashes(lambda: gate.schedule(host, "outbox", clock.now()))
    try:
        run_pass(host)
    except PassFailed as group:  # the lane's failure and the crash, together
        if not all(isinstance(e, (RuntimeError, FailpointError)) for e in group.exceptions):
            raise
    except RuntimeError:
        pass
    except FailpointError:
        pass


def recovery_pages(host: Host, clock: FakeClock) -> None:
    for _ in range(agent_recovery.PAGE_SIZE + 3):  # two pages of expired leases
        crashes(lambda: submit(host))
    Submission.objects.filter(host=host).update(
        state="running", lease_owner="dead", lease_expires_at=clock.now() - timedelta(seconds=1)
    )
    crashes(lambda: run_pass(host))


def binding_park(host: Host, clock: FakeClock) -> None:
    crashes(lambda: submit(host))
    spec = registry.lookup("echo", "1")
    assert spec is not None
    registry.unregister("echo", "1")
    crashes(lambda: run_pass(host))
    registry.register("echo", spec.fn, version="1", retry_safe=True)
    crashes(lambda: ensure_alarm(host))


def fault_retry(host: Host, clock: FakeClock) -> None:
    original = agent_recovery._sweep
    failures = [1]

    def failing_once(*args: Any) -> Any:
        if failures[0]:
            failures[0] -= 1
            raise RuntimeError("ledger unavailable")
        return original(*args)

    crashes(lambda: submit(host))
    # An attempt that died with its lease: recoverable work, so the pass sweeps the thread.
    Submission.objects.filter(host=host).update(
        state="running", lease_owner="crashed", lease_expires_at=clock.now() - timedelta(seconds=1)
    )
    agent_recovery._sweep = failing_once  # type: ignore[assignment]
    try:
        crashes(lambda: run_pass(host))
    finally:
        agent_recovery._sweep = original  # type: ignore[assignment]
    clock.advance(seconds=5)
    crashes(lambda: run_pass(host))  # the retry after the fault's 5 s
    # A failed wave, so that rearm_failure runs too.
    lanes.register("broken", lambda ctx: (_ for _ in ()).throw(RuntimeError("once")))
    crashes(lambda: gate.schedule(host, "broken", clock.now()))
    with contextlib.suppress(RuntimeError, FailpointError):
        run_pass(host)
    lanes.register("broken", lambda ctx: None)


def retried_head(host: Host, clock: FakeClock) -> None:
    """A first attempt that raises and is retried: a crash between the failed attempt and its
    retry being recorded leaves the attempt to lease expiry and recovery."""

    def flaky(ctx: Any, payload: Any) -> Any:
        EXECUTIONS.append(ctx.submission.pk)
        if EXECUTIONS.count(ctx.submission.pk) == 1:
            raise RuntimeError("the first try fails")
        return payload

    retry = durable_agent.RetryPolicy(max_attempts=3, backoff=1, cap=1)
    registry.register("flaky", flaky, version="1", retry=retry)
    crashes(
        lambda: durable_agent.submit(
            host=host, thread="t1", agent="flaky", payload={"n": next(_keys)}
        )
    )
    crashes(lambda: run_pass(host))  # the first attempt fails; its retry is recorded
    clock.advance(seconds=1)
    crashes(lambda: run_pass(host))  # the retry


def batch_delivery(host: Host, clock: FakeClock) -> None:
    """Two hosts whose slots fired together, delivered to one ``fire_alarms`` task (Note
    [Several hosts per delivered task] in durable_agent/broker.py); after a crash anywhere in
    it, the sweep re-arms every host of the delivery whose pass did not run."""
    other = Host.objects.create(key=f"batch-{next(_keys)}")
    crashes(lambda: submit(other))
    crashes(lambda: submit(host))
    together = [h for h in (other, host) if alarm.scheduled(h) is not None]
    deliveries = [[h.pk, alarm.scheduled(h).isoformat()] for h in together]  # type: ignore[union-attr]
    slots = Host.objects.filter(pk__in=[h.pk for h in together]).values_list("alarm_id")
    Schedule.objects.filter(pk__in=slots).update(repeats=0)  # fired, as the broker fires them
    if deliveries:
        clock.set(max(datetime.fromisoformat(d) for _, d in deliveries))
    try:
        tasks.fire_alarms(deliveries)
    except FailpointError:
        pass
    except PassError as exc:  # a pass of the delivery crashed; the others ran
        if "failpoint maintenance:" not in str(exc):
            raise
    clock.advance(seconds=int(conf.get("SWEEP_GRACE_MS")) / 1000 + 1)
    tasks.sweep()
    for h in (other, host):  # no host of the delivery is left with work and no alarm
        assert audit_host(Host.objects.select_related("alarm").get(pk=h.pk)).ok
    assert_converges(other, clock)


SCENARIOS: dict[str, Callable[[Host, FakeClock], None]] = {
    "gate mutation": gate_mutation,
    "submit": submit_only,
    "settling head": settling_head,
    "failing lane": failing_lane,
    "recovery pages": recovery_pages,
    "binding park": binding_park,
    "fault retry": fault_retry,
    "retried head": retried_head,
    "batch delivery": batch_delivery,
}

BEGIN_TO_FINISH = {
    "maintenance:begin:before",
    "maintenance:begin:after",
    "maintenance:select:before",
    "maintenance:select:after",
    "maintenance:checkpoint:before",
    "maintenance:checkpoint:after",
    "maintenance:finish:before",
    "maintenance:finish:after",
    "maintenance:queue:flush",
}
# A pass with nothing after its checkpoint is finished by it (Note [The checkpoint finishes a
# pass that has nothing after it] in durable_agent/maintenance/passes/native.py): it passes
# no finish failpoint. A failed pass never reaches its finish either.
CHECKPOINT_FINISHES = BEGIN_TO_FINISH - {"maintenance:finish:before", "maintenance:finish:after"}
# A fresh head is claimed without a sweep (Note [A thread with nothing to recover is not
# swept] in the same module); a head with recoverable work is recovered before its claim.
FRESH_ATTEMPT = CHECKPOINT_FINISHES
RECOVERY = {"maintenance:recovery-status:before", "maintenance:recovery-status:after"}
ATTEMPT = BEGIN_TO_FINISH | RECOVERY
FAILED_PASS = CHECKPOINT_FINISHES
SCENARIO_FAILPOINTS: dict[str, set[str]] = {
    "gate mutation": BEGIN_TO_FINISH
    | {
        "maintenance:dirty:before",
        "maintenance:dirty:after",
        "maintenance:mutation:armed",
        "maintenance:mutation:finished",
    },
    "submit": {"maintenance:queue:flush"},
    "settling head": FRESH_ATTEMPT,
    "failing lane": FAILED_PASS | {"maintenance:retry:before", "maintenance:retry:after"},
    "recovery pages": CHECKPOINT_FINISHES | RECOVERY,
    "binding park": FRESH_ATTEMPT
    | {
        "maintenance:binding-retry:before",
        "maintenance:binding-retry:after",
        "maintenance:ensure:before",
        "maintenance:ensure:after",
    },
    "fault retry": ATTEMPT
    | {
        "maintenance:retry:before",
        "maintenance:retry:after",
    },
}
SCENARIO_FAILPOINTS["retried head"] = FRESH_ATTEMPT
SCENARIO_FAILPOINTS["batch delivery"] = FRESH_ATTEMPT | {"maintenance:batch:next"}
CASES = [(s, f) for s in SCENARIOS for f in sorted(SCENARIO_FAILPOINTS[s])]


def assert_converges(host: Host, clock: FakeClock) -> None:
    if not MaintenanceState.objects.filter(host=host).exists():
        assert not Submission.objects.filter(host=host).exists()  # nothing was ever accepted
        return
    audit = audit_host(Host.objects.select_related("alarm").get(pk=host.pk))
    assert audit.ok, audit.violations
    for _ in range(4):
        drain(host, clock, limit=300)
        if not Submission.objects.filter(host=host).exclude(state="settled").exists():
            break
        clock.advance(minutes=61)  # past any parked floor
        ensure_alarm(host)
    rows = list(Submission.objects.filter(host=host))
    assert all(r.state == "settled" and r.outcome == "completed" for r in rows), [
        (r.pk, r.state, r.outcome) for r in rows
    ]
    assert all(r.result is not None for r in rows)
    state = MaintenanceState.objects.get(host=host)
    assert state.dirty == state.processed
    assert alarm.scheduled(host) is None


def test_matrix__covers_every_failpoint(clock: FakeClock) -> None:
    seen: dict[str, set[str]] = {}
    for name, scenario in SCENARIOS.items():
        hits: list[str] = []
        host = Host.objects.create(key=f"dry-{next(_keys)}")
        with failpoints.installed(failpoints.recorder(hits)):
            scenario(host, clock)
        seen[name] = set(hits)
        assert_converges(host, clock)
    differences = {
        name: (
            sorted(seen[name] - SCENARIO_FAILPOINTS[name]),
            sorted(SCENARIO_FAILPOINTS[name] - seen[name]),
        )
        for name in SCENARIOS
        if seen[name] != SCENARIO_FAILPOINTS[name]
    }
    assert not differences, (
        f"(passed but not in the table, in the table but not passed): {differences}"
    )
    assert set().union(*seen.values()) == ALL


@pytest.mark.parametrize(("scenario", "location"), CASES)
def test_matrix__a_crash_converges(clock: FakeClock, scenario: str, location: str) -> None:
    host = Host.objects.create(key=f"crash-{next(_keys)}")
    hits: list[str] = []
    crash = failpoints.raise_at(location)

    def handler(name: str) -> None:
        hits.append(name)
        crash(name)

    with failpoints.installed(handler):
        SCENARIOS[scenario](host, clock)
    assert location in hits
    accepted = Submission.objects.filter(host=host).count()
    assert_converges(host, clock)
    assert Submission.objects.filter(host=host).count() == accepted  # nothing lost, no extra
