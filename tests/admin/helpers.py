"""Helpers of the admin tests: hosts in interesting states, made through the real services."""

from __future__ import annotations

from typing import Any

from django.test import Client
from django.urls import reverse

from durable_agent import lanes
from durable_agent.maintenance import alarm, gate, run_pass
from durable_agent.models import BindingRetry, DueLane, Host, RecoveryFault
from durable_agent.runtime import Blocked, RecoverySweep
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.maintenance.helpers import caught_up


def park(host: Host, clock: FakeClock, lane: str = "outbox") -> DueLane:
    """Park ``lane``: a handler that always asks to run again stalls 8 passes in a row."""
    lanes.register(lane, lambda ctx: ctx.now())
    caught_up(host)
    gate.schedule(host, lane, clock.now())
    for _ in range(8):
        slot = alarm.scheduled(host)
        assert slot is not None
        clock.set(max(slot, clock.now()))
        run_pass(host, deadline=slot, guard=True)
    row = DueLane.objects.get(host=host, lane=lane)
    assert row.state == "parked"
    return row


def wait_for_binding(host: Host, runtime: ScriptedRuntime, thread: str = "t1") -> BindingRetry:
    """A head whose agent binding is unavailable: the pass parks it as a binding retry."""
    runtime.submit(host, thread, behaviour="binding")
    run_pass(host)
    return BindingRetry.objects.get(host=host, thread=thread)


def fail_recovery(host: Host, runtime: ScriptedRuntime, thread: str = "t2") -> RecoveryFault:
    """A thread whose recovery is blocked: the pass records a recovery fault."""
    runtime.submit(host, thread)
    runtime.script_recovery(
        host, thread, RecoverySweep(blocked=(Blocked(thread, {"reason": "db down"}),))
    )
    run_pass(host)
    return RecoveryFault.objects.get(host=host, thread=thread)


def changelist(model: str) -> str:
    return reverse(f"admin:durable_agent_{model}_changelist")


def host_page(host: Host) -> str:
    return reverse("admin:durable_agent_host_change", args=[host.pk])


def post_action(
    client: Client, model: str, action: str, pks: list[int], *, follow: bool = False, **data: Any
) -> Any:
    """POST an admin action the way the host page's buttons and the confirmation page do."""
    payload: dict[str, Any] = {"action": action, "_selected_action": [str(pk) for pk in pks]}
    payload.update(data)
    return client.post(changelist(model), payload, follow=follow)


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]] if response.context else []
