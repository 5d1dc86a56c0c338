"""A protocol state machine: random producers, clocks, passes, crashes and repairs.

After every step the alarm invariant holds; at teardown firing alarms converges with every
accepted submission settled exactly once.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from durable_agent import lanes
from durable_agent.errors import AlarmError, PassFailed
from durable_agent.maintenance import alarm, ensure_alarm, failpoints, gate, repairs, run_pass
from durable_agent.maintenance.failpoints import FailpointError
from durable_agent.maintenance.operators.audit import audit_host
from durable_agent.models import DueLane, Host, MaintenanceState
from durable_agent.testing import FakeClock, ScriptedRuntime, installed_runtime
from tests.examples import examples
from tests.maintenance.helpers import drain

EXAMPLES = examples(200)  # 50 in the quick mode (tests/examples.py)
_keys = itertools.count()

THREADS = st.sampled_from(["t1", "t2", "t3"])
BEHAVIOURS = st.sampled_from(["settle", "settle", "settle", "fail", "hang-once", "binding"])
LANES = st.sampled_from(["outbox", "mailer"])


def _expected(exc: BaseException) -> bool:
    """A failure the machine causes on purpose: a failpoint (bare or inside an alarm
    transaction's error), or a lane that fails on purpose."""
    if isinstance(exc, FailpointError):
        return True
    if isinstance(exc, AlarmError):
        return isinstance(exc.__cause__, FailpointError)
    return isinstance(exc, RuntimeError) and "flaky" in str(exc)


class Protocol(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock: FakeClock = CLOCK[0]
        self.runtime = ScriptedRuntime(registry_key=f"r{next(_keys)}")
        self.host = Host.objects.create(key=f"sm-{next(_keys)}")
        self.accepted = []
        self._previous_runtime = installed_runtime(self.runtime)
        self._previous_runtime.__enter__()

    def teardown(self) -> None:
        try:
            # Deploy a registry that binds everything, then fire alarms until quiet.
            for item in self.accepted:
                if item.behaviour == "binding":
                    item.behaviour = "settle"
            self.runtime.registry_key += "-fixed"
            ensure_alarm(self.host)
            for _ in range(3):
                drain(self.host, self.clock, limit=400)
                if all(i.settled for i in self.accepted):
                    break
                self.clock.advance(minutes=61)  # past parked floors
                ensure_alarm(self.host)
            assert all(i.settled for i in self.accepted), self.accepted
            assert all(i.settlements == 1 for i in self.accepted)
            state = MaintenanceState.objects.get(host=self.host)
            assert state.dirty == state.processed
            assert alarm.scheduled(self.host) is None
        finally:
            self._previous_runtime.__exit__(None, None, None)

    def _attempt(self, action) -> None:  # type: ignore[no-untyped-def]
        try:
            action()
        except PassFailed as group:  # a pass that failed in several places: each expected
            for failure in group.exceptions:
                if not _expected(failure):
                    raise
        except Exception as exc:
            if not _expected(exc):
                raise

    @rule(thread=THREADS, behaviour=BEHAVIOURS)
    def submit(self, thread: str, behaviour: str) -> None:
        if behaviour == "hang-once":

            def once(item, seen=[]):  # noqa: B006  (state across attempts of one item)
                seen.append(1)
                return None if len(seen) == 1 else "completed"

            chosen: object = once
        else:
            chosen = behaviour
        self.accepted.append(self.runtime.submit(self.host, thread, behaviour=chosen))

    @rule()
    def mutate(self) -> None:
        self._attempt(lambda: gate.mutation(self.host).__enter__() and None)
        gate._mutation_lanes.set(None)

    @rule()
    def mutate_and_finish(self) -> None:
        def body() -> None:
            with gate.mutation(self.host):
                pass

        self._attempt(body)

    @rule(lane=LANES, seconds=st.integers(0, 120))
    def schedule_lane(self, lane: str, seconds: int) -> None:
        self._attempt(
            lambda: gate.schedule(self.host, lane, self.clock.now() + timedelta(seconds=seconds))
        )

    @rule(ms=st.integers(1, 90_000))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms=ms)

    @rule()
    def run_a_pass(self) -> None:
        self._attempt(lambda: run_pass(self.host))

    @rule()
    def fire_the_alarm(self) -> None:
        slot = alarm.scheduled(self.host)
        if slot is not None and slot <= self.clock.now():
            self._attempt(lambda: run_pass(self.host, deadline=slot, guard=True))

    @rule(location=st.sampled_from(failpoints.LOCATIONS))
    def crash_at_a_failpoint(self, location: str) -> None:
        with failpoints.installed(failpoints.raise_at(location)):
            self._attempt(lambda: run_pass(self.host))

    @rule()
    def rearm(self) -> None:
        alarm.rearm(self.host, actor="sm", reason="state machine")

    @rule(lane=LANES)
    def unpark(self, lane: str) -> None:
        row = DueLane.objects.filter(host=self.host, lane=lane, state="parked").first()
        if row is not None:
            repairs.lane_unpark(host=self.host, lane=lane, actor="sm", reason="state machine")

    @rule()
    def registry_change(self) -> None:
        self.runtime.registry_key += "+"
        ensure_alarm(self.host)

    @invariant()
    def alarm_invariant(self) -> None:
        if MaintenanceState.objects.filter(host=self.host).exists():
            result = audit_host(Host.objects.select_related("alarm").get(pk=self.host.pk))
            assert result.ok, result.violations


CLOCK: list[FakeClock] = []


@pytest.mark.django_db
def test_protocol_state_machine(clock: FakeClock) -> None:
    calls = {"mailer": 0}

    def flaky(ctx):  # fails every third wave
        calls["mailer"] += 1
        if calls["mailer"] % 3 == 0:
            raise RuntimeError("flaky mailer")

    lanes.register("outbox", lambda ctx: None)
    lanes.register("mailer", flaky)
    CLOCK[:] = [clock]
    run_state_machine_as_test(
        Protocol,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )
