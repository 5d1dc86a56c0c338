"""What agent code (and lane code) raises ends the attempt once: Note [What an agent raises]
(``durable_agent/agents/attempts.py``) and Note [A stop is not a failure]
(``durable_agent/errors.py``)."""

from __future__ import annotations

import io
import json
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DataError, connections
from django_q.exceptions import TimeoutException

import durable_agent
from durable_agent import lanes, tasks
from durable_agent.agents import registry
from durable_agent.agents.context import ApprovalRequested
from durable_agent.agents.runtime import ReferenceRuntime
from durable_agent.errors import PassError
from durable_agent.maintenance import alarm, gate, run_pass
from durable_agent.maintenance.passes.recovery import failure_of
from durable_agent.models import Host, PassRecord, RecoveryFault, Submission
from durable_agent.runtime import Blocked, RecoverySweep, Settlement
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.agents.conftest import later

pytestmark = pytest.mark.django_db


@pytest.fixture
def sigint_ignored() -> Iterator[None]:
    """SIGINT as a django-q worker process has it (ignored)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, previous)


def agent_raising(exc: BaseException) -> Callable[[Any, Any], None]:
    def agent(ctx: Any, payload: Any) -> None:
        raise exc

    return agent


def attempt(host: Host, clock: FakeClock, reference: ReferenceRuntime, *, on_thread: bool) -> Any:
    """``process_thread_head`` on this (the main) thread, or on another one like a pass's pool;
    returns its Settlement, or the BaseException it raised."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(reference.process_thread_head(host, "t", later(clock)))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            if on_thread:
                connections.close_all()

    if on_thread:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    else:
        run()
    return outcome[0]


def submitted(host: Host, exc: BaseException) -> int:
    registry.register("hostile", agent_raising(exc), version="1")
    return durable_agent.submit(host=host, thread="t", agent="hostile", payload={}).submission_id


@pytest.mark.django_db(transaction=True)  # a thread of its own has its own connection
@pytest.mark.parametrize(
    ("exc", "on_thread"),
    [
        (KeyboardInterrupt("raised by code"), True),
        (TimeoutException("raised by code"), True),
        (SystemExit("raised by code"), False),
        (GeneratorExit("raised by code"), False),
    ],
    ids=["keyboard-interrupt-on-a-pool-thread", "timeout-on-a-pool-thread", "exit", "gen-exit"],
)
def test_process_thread_head__a_base_exception_from_agent_code_settles_failed(
    host: Host, clock: FakeClock, reference: ReferenceRuntime, exc: BaseException, on_thread: bool
) -> None:
    pk = submitted(host, exc)
    assert attempt(host, clock, reference, on_thread=on_thread) == Settlement(
        "t", str(pk), "failed"
    )
    row = Submission.objects.get(pk=pk)
    assert (row.state, row.outcome) == ("settled", "failed")
    assert row.error == {"type": type(exc).__name__, "message": "raised by code"}


@pytest.mark.usefixtures("sigint_ignored")
def test_process_thread_head__a_keyboard_interrupt_where_sigint_is_ignored_settles_failed(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    pk = submitted(host, KeyboardInterrupt())
    assert attempt(host, clock, reference, on_thread=False) == Settlement("t", str(pk), "failed")
    assert Submission.objects.get(pk=pk).error == {"type": "KeyboardInterrupt", "message": ""}


@pytest.mark.parametrize(
    "exc",
    [KeyboardInterrupt(), TimeoutException("Task exceeded maximum timeout value (60 seconds)")],
    ids=["ctrl-c", "django-q-timeout"],
)
def test_process_thread_head__a_stop_on_the_main_thread_is_left_to_the_lease(
    host: Host, clock: FakeClock, reference: ReferenceRuntime, exc: BaseException
) -> None:
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    pk = submitted(host, exc)
    assert attempt(host, clock, reference, on_thread=False) is exc
    row = Submission.objects.get(pk=pk)
    assert (row.state, row.error, row.attempts) == ("running", None, 1)


def test_process_thread_head__a_group_of_approvals_suspends_for_the_first(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    group = BaseExceptionGroup(
        "tasks", [ApprovalRequested("first"), BaseExceptionGroup("inner", [ApprovalRequested("b")])]
    )
    pk = submitted(host, group)
    assert attempt(host, clock, reference, on_thread=False) is None
    row = Submission.objects.get(pk=pk)
    assert (row.state, row.approval_reason, row.error) == ("suspended", "first", None)


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (
            BaseExceptionGroup("tasks", [ApprovalRequested("ship"), ValueError("broke")]),
            {
                "type": "BaseExceptionGroup",
                "message": "tasks (2 sub-exceptions): ApprovalRequested: ship; ValueError: broke",
            },
        ),
        (
            ApprovalRequested("x" * 2001),
            {"type": "ApprovalRequested", "message": "x" * 1999 + "\u2026"},
        ),
        (ApprovalRequested(""), {"type": "ApprovalRequested", "message": ""}),
    ],
    ids=["approval-and-failure", "forged-too-long", "forged-empty"],
)
def test_process_thread_head__anything_but_a_valid_approval_settles_failed(
    host: Host, clock: FakeClock, reference: ReferenceRuntime, exc: BaseException, error: Any
) -> None:
    pk = submitted(host, exc)
    assert attempt(host, clock, reference, on_thread=False) == Settlement("t", str(pk), "failed")
    assert Submission.objects.get(pk=pk).error == error


def test_run_pass__a_lane_s_base_exception_fails_the_pass_as_a_pass_error(
    host: Host, clock: FakeClock
) -> None:
    def lane(ctx: Any) -> None:
        raise SystemExit("lane exit")

    lanes.register("exits", lane)
    gate.schedule(host, "exits", clock.now())
    with pytest.raises(PassError) as raised:
        run_pass(host)
    assert isinstance(raised.value.__cause__, SystemExit)
    assert str(raised.value) == "SystemExit: lane exit"
    assert PassRecord.objects.get(host=host, phase="failed").error == "SystemExit: lane exit"
    assert alarm.scheduled(host) is not None  # backed off, still armed


def test_run_pass__a_stop_propagates_as_it_is(host: Host, clock: FakeClock) -> None:
    stop = KeyboardInterrupt()

    def lane(ctx: Any) -> None:
        raise stop

    lanes.register("stopped", lane)
    gate.schedule(host, "stopped", clock.now())
    with pytest.raises(KeyboardInterrupt) as raised:
        run_pass(host)
    assert raised.value is stop
    assert PassRecord.objects.get(host=host, phase="failed").error == "KeyboardInterrupt"


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


def test_fire_alarm__a_failed_pass_raises_a_storable_pass_error(
    host: Host, clock: FakeClock
) -> None:
    def lane(ctx: Any) -> None:
        raise BadStr()

    lanes.register("bad", lane)
    gate.schedule(host, "bad", clock.now())
    due = alarm.scheduled(host)
    assert due is not None
    clock.set(due)
    with pytest.raises(PassError) as raised:
        tasks.fire_alarm(host.pk, deadline=due.isoformat())
    assert (
        str(raised.value) == "BadStr: (the message of this BadStr could not be read: RuntimeError)"
    )
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__


def test_recovery_faults__a_runtime_s_diagnostic_is_stored_storable(
    host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    runtime.submit(host, "t")
    runtime.script_recovery(
        host,
        "t",
        RecoverySweep(blocked=(Blocked("t", {"reason": "db\x00down", "detail\ud800": ["x\x00"]}),)),
    )
    run_pass(host)
    fault = RecoveryFault.objects.get(host=host, thread="t")
    assert fault.failure == {"reason": "db\ufffddown", "detail\ufffd": ["x\ufffd"]}
    assert failure_of(BadStr("\x00"), phase="recovery", operation="run recovery")["diagnostic"] == {
        "error": "BadStr",
        "message": "(the message of this BadStr could not be read: RuntimeError)",
    }


def test_run_pass__a_database_error_is_recorded_without_its_statement(
    host: Host, clock: FakeClock
) -> None:
    def lane(ctx: Any) -> None:
        raise DataError(
            "value too long for type character varying(8)\n"
            "LINE 1: INSERT INTO \"secrets\" VALUES ('the agent''s payload')\n"
            "DETAIL:  Failing row contains (the agent's payload)."
        )

    lanes.register("writes", lane)
    gate.schedule(host, "writes", clock.now())
    with pytest.raises(DataError):
        run_pass(host)
    assert PassRecord.objects.get(host=host, phase="failed").error == (
        "DataError: value too long for type character varying(8)"
    )


def test_maintenance_pass__a_host_whose_lane_exits_is_reported_and_the_next_host_runs(
    clock: FakeClock,
) -> None:
    def lane(ctx: Any) -> None:
        raise SystemExit(3)

    lanes.register("exits", lane)
    exits, quiet = Host.objects.create(key="exits"), Host.objects.create(key="quiet")
    gate.schedule(exits, "exits", clock.now())
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("maintenance_pass", "--host", "exits", "--host", "quiet", "--json", stdout=out)
    result = json.loads(out.getvalue())
    assert result["failed"] == 1
    first, second = result["passes"]
    assert (first["host"], first["ok"], first["error"]) == (
        "exits",
        False,
        "PassError: SystemExit: 3",
    )
    assert (second["host"], second["ok"]) == (quiet.key, True)
