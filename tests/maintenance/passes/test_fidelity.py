"""The pass against upstream's rules where the port used to deviate (docs/pass.md).

Every firing goes through django-q's own scheduler and the tasks it enqueues
(``tests.qdrive``), never ``run_pass`` directly; hence ``transaction=True``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from durable_agent import lanes
from durable_agent.maintenance import failpoints, gate
from durable_agent.models import Host, MaintenanceState
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.maintenance.helpers import caught_up
from tests.qdrive import fire_due, next_armed

pytestmark = pytest.mark.django_db(transaction=True)
US = timedelta(microseconds=1)


def fire(clock: FakeClock) -> list[Any]:
    """Move the clock just past the armed slot and let django-q fire it."""
    due = next_armed()
    assert due is not None, "no alarm armed"
    if due >= clock.now():
        clock.set(due + US)
    return fire_due(clock)


@contextmanager
def at_the_yield_point(clock: FakeClock) -> Iterator[None]:
    """Push every pass's clock exactly to its yield point (``YIELD_AFTER_MS`` after its start)
    right after its begin transaction."""

    def push(name: str) -> None:
        if name == "maintenance:begin:after":
            clock.advance(minutes=10)

    with failpoints.installed(push):
        yield


# -- after-native waves ------------------------------------------------------------------


def test_after_native__waves_run_at_the_yield_point_and_only_lanes_that_ran_rotate(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    """After-native waves are bounded only by the dispatch deadline (``DISPATCH_UNTIL_MS``),
    not by the yield point, and the rotation cursor names the last lane whose wave ran: with
    the pass clock pushed exactly to the yield point and lanes a, b, c due, where each wave
    takes its whole 100 s allowance of the 4 minutes left, one pass runs a, b and the next
    c, a (docs/pass.md,
    "3. After-native waves")."""
    ran: list[str] = []

    def run(ctx: Any) -> Any:
        ran.append(ctx.lane)
        clock.advance(seconds=100)
        return ctx.now()  # still due: it wants another wave

    for name in ("a", "b", "c"):
        lanes.register(name, run, phase="after-native", allowance_ms=100_000)
    caught_up(host)
    for name in ("a", "b", "c"):
        gate.schedule(host, name, clock.now())

    with at_the_yield_point(clock):
        first = fire(clock)
        assert ran == ["a", "b"]
        assert MaintenanceState.objects.get(host=host).last_after_native_lane == "b"

        second = fire(clock)

    assert ran == ["a", "b", "c", "a"]
    assert MaintenanceState.objects.get(host=host).last_after_native_lane == "a"
    assert [r["alarm"] for r in first + second] == ["rearmed", "rearmed"]  # b, c still due


# -- documented entry points ---------------------------------------------------------------


def test_fire_alarm__without_a_deadline_is_guarded_as_if_fired_now(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    """A delivery without its deadline is guarded as if it fired now (docs/pass.md,
    "fire_alarm"): stale while the slot holds a later time, run once the slot is due."""
    from durable_agent.maintenance import alarm
    from durable_agent.tasks import fire_alarm

    item = runtime.submit(host, "t1")
    slot = alarm.scheduled(host)
    assert slot is not None
    assert slot > clock.now()

    assert fire_alarm(host.pk)["phase"] == "stale"
    assert not item.settled

    clock.set(slot)
    assert fire_alarm(host.pk)["phase"] == "actionable"
    assert item.settled


def test_admin__the_ledger_models_are_registered() -> None:
    """durable_agent registers Thread and Submission in the admin itself
    (docs/first-agent.md section 6)."""
    from django.contrib import admin

    from durable_agent.models import Submission, Thread

    assert admin.site.is_registered(Submission)
    assert admin.site.is_registered(Thread)


# -- recovery events -----------------------------------------------------------------------


def test_recovery_events__a_cleared_fault_is_delivered_in_the_pass_that_clears_it(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    """When a retried abort settles and its fault clears, the ``cleared`` event is delivered
    and the alarm cleared within that same pass: events the pass created are delivered
    before it finishes, so a quiet host ends with no alarm (docs/pass.md, "Recovery events
    and the recovery_fault signal")."""
    from durable_agent.models import RecoveryEvent, RecoveryFault
    from durable_agent.runtime import RecoveryReport, RecoverySweep
    from durable_agent.signals import recovery_fault

    item = runtime.submit(host, "a")
    runtime.abort_intents[item.submission] = clock.now()
    reads: list[str] = []

    def read_abort_intent(host: Any, submission: str) -> object | None:
        reads.append(submission)
        if len(reads) == 1:
            raise RuntimeError("ledger unavailable")
        return runtime.abort_intents.get(submission)

    def settle_aborted(cursor: str | None) -> RecoverySweep:
        item.state, item.outcome = "settled", "aborted"
        report = RecoveryReport("a", item.submission, "SettleAborted", "repaired")
        return RecoverySweep(reports=(report,))

    runtime.read_abort_intent = read_abort_intent  # type: ignore[method-assign]
    runtime.script_recovery(host, "a", settle_aborted)
    delivered: list[str] = []

    def receive(sender: Any, host: Host, event: RecoveryEvent, **_: Any) -> None:
        delivered.append(event.transition)

    recovery_fault.connect(receive, sender=RecoveryEvent, dispatch_uid="fidelity-events")
    try:
        fire(clock)
        assert RecoveryFault.objects.filter(host=host).exists()
        assert delivered == ["created"]  # delivered in the pass that created it, too
        while RecoveryFault.objects.filter(host=host).exists():
            fire(clock)
    finally:
        recovery_fault.disconnect(sender=RecoveryEvent, dispatch_uid="fidelity-events")

    assert item.outcome == "aborted"
    assert delivered == ["created", "cleared"]
    assert next_armed() is None  # that same pass cleared the alarm
    state = MaintenanceState.objects.get(host=host)
    assert state.recovery_event_acknowledged == state.recovery_event_sequence == 2


# -- failures ------------------------------------------------------------------------------


def test_failures__a_pass_raises_and_records_every_failure(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    """When an attempt fails and an admitted wave also overruns its allowance, the pass's
    one error carries both, the PassRecord keeps both, and the API's pass record (which the
    admin's host page shows too) lists both (docs/pass.md, "Failures: rearm_failure, then
    re-raise")."""
    from durable_agent.api.schemas import PassRecordOut
    from durable_agent.errors import AlarmError, PassError, PassFailed
    from durable_agent.models import PassRecord

    runtime.submit(host, "t1", behaviour="raise")

    def slow(ctx: Any) -> None:
        clock.advance(seconds=2)  # past its 1 s allowance

    lanes.register("outbox", slow, allowance_ms=1_000)
    gate.schedule(host, "outbox", clock.now())

    with pytest.raises(PassError) as caught:  # the task's storable stand-in (docs/pass.md)
        fire(clock)

    failed = caught.value.__context__
    assert isinstance(failed, PassFailed)
    assert str(caught.value) == f"PassFailed: {failed}"
    first, second = failed.exceptions
    assert isinstance(first, RuntimeError)
    assert isinstance(second, AlarmError)
    assert second.operation == "host dispatch allowance"
    record = PassRecord.objects.get(host=host, phase="failed")
    assert "RuntimeError: attempt of" in record.error
    assert "host dispatch allowance" in record.error
    assert PassRecordOut.model_validate(record).error == record.error
    assert next_armed() is not None  # rearm_failure kept the alarm armed


# -- publication ---------------------------------------------------------------------------


def test_publication__a_pending_publication_holds_the_native_step_until_its_own_deadline(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    """The publication lane runs before the native step (a barrier); while it is still
    pending the native step waits and the alarm is set at the publication lane's deadline,
    not re-armed at the minimum delay; once it is idle the native work runs and the host goes
    quiet (docs/lanes.md, "Framework lanes"; docs/pass.md, "2. Concurrent waves and the native
    step")."""
    from durable_agent.models import DueLane

    published: list[Any] = []

    def publish(ctx: Any) -> Any:
        published.append(ctx.now())
        return ctx.now() + timedelta(seconds=10) if len(published) == 1 else None

    lanes.install_framework("agent:publication", publish)
    item = runtime.submit(host, "t1")

    first = fire(clock)
    assert len(published) == 1
    assert not item.settled
    assert next_armed() == published[0] + timedelta(seconds=10)
    assert DueLane.objects.get(host=host, lane="agent:native").stalls <= 1

    results = list(first)
    while next_armed() is not None:
        results += fire(clock)

    assert len(published) == 2
    assert item.settled
    assert all(r["phase"] in ("actionable", "caught-up", "stale") for r in results)
