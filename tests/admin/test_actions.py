"""The repair actions through the Django test client: permission, confirmation, audit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory

from durable_agent.maintenance import alarm, gate
from durable_agent.models import (
    AlarmAudit,
    BindingRetry,
    DueLane,
    Host,
    PassRecord,
    RecoveryFault,
)
from durable_agent.testing import FakeClock, ScriptedRuntime
from tests.admin.helpers import (
    changelist,
    fail_recovery,
    host_page,
    messages_of,
    park,
    post_action,
    wait_for_binding,
)
from tests.maintenance.helpers import caught_up

pytestmark = pytest.mark.django_db


def _iso(clock: FakeClock, **delta: float) -> str:
    return (clock.now() + timedelta(**delta)).strftime("%Y-%m-%dT%H:%M:%S")


@dataclass(frozen=True)
class Case:
    """One repair action: how to make its target, and how to see that it worked."""

    model: str
    action: str
    audit_action: str
    setup: Callable[[Host, FakeClock, ScriptedRuntime], int]
    done: Callable[[Host, FakeClock, ScriptedRuntime], bool]
    data: Callable[[FakeClock], dict[str, str]] = lambda clock: {}


def _owing(host: Host, clock: FakeClock, runtime: ScriptedRuntime) -> int:
    caught_up(host)
    gate.schedule(host, "outbox", clock.now() + timedelta(minutes=1))
    return int(host.pk)


def _submitted(host: Host, clock: FakeClock, runtime: ScriptedRuntime) -> int:
    runtime.submit(host, "t1")
    return int(host.pk)


CASES = [
    Case(
        "host",
        "rearm_now",
        "rearm",
        _owing,
        lambda host, clock, rt: alarm.scheduled(host) == clock.now() + timedelta(minutes=1),
    ),
    Case(
        "host",
        "rearm_at",
        "rearm",
        _owing,
        lambda host, clock, rt: alarm.scheduled(host) == clock.now() + timedelta(seconds=10),
        lambda clock: {"at": _iso(clock, seconds=10)},
    ),
    Case(
        "host",
        "run_pass_now",
        "pass",
        _submitted,
        lambda host, clock, rt: rt.submissions[0].settled and PassRecord.objects.exists(),
    ),
    Case(
        "duelane",
        "unpark_lanes",
        "unpark",
        lambda host, clock, rt: int(park(host, clock).pk),
        lambda host, clock, rt: DueLane.objects.get(host=host, lane="outbox").state == "pending",
    ),
    Case(
        "bindingretry",
        "retry_bindings",
        "retry-binding",
        lambda host, clock, rt: int(wait_for_binding(host, rt).pk),
        lambda host, clock, rt: not BindingRetry.objects.filter(host=host).exists(),
    ),
    Case(
        "recoveryfault",
        "retry_faults",
        "retry-fault",
        lambda host, clock, rt: int(fail_recovery(host, rt).pk),
        lambda host, clock, rt: RecoveryFault.objects.get(host=host).retry_at == clock.now(),
    ),
]
IDS = [case.action for case in CASES]


@pytest.fixture(params=CASES, ids=IDS)
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


def _snapshot(host: Host) -> dict[str, Any]:
    """Everything a repair could change."""
    return {
        "slot": alarm.scheduled(host),
        "audits": AlarmAudit.objects.count(),
        "passes": PassRecord.objects.count(),
        "lanes": list(DueLane.objects.filter(host=host).values().order_by("pk")),
        "retries": list(BindingRetry.objects.filter(host=host).values().order_by("pk")),
        "faults": list(RecoveryFault.objects.filter(host=host).values().order_by("pk")),
    }


def test_actions__each_writes_exactly_one_audit_row_naming_the_user(
    operator_client: Client,
    operator: User,
    host: Host,
    clock: FakeClock,
    runtime: ScriptedRuntime,
    case: Case,
) -> None:
    pk = case.setup(host, clock, runtime)
    before = AlarmAudit.objects.count()

    confirmation = post_action(operator_client, case.model, case.action, [pk])
    assert confirmation.status_code == 200
    assert confirmation.templates[0].name == "admin/durable_agent/confirm_action.html"
    assert f'name="action" value="{case.action}"' in confirmation.content.decode()
    assert AlarmAudit.objects.count() == before  # the confirmation page changes nothing

    done = post_action(
        operator_client,
        case.model,
        case.action,
        [pk],
        post="yes",
        reason="  on-call fix  ",
        next=host_page(host),
        follow=True,
        **case.data(clock),
    )

    assert done.redirect_chain == [(host_page(host), 302)]
    assert AlarmAudit.objects.count() == before + 1
    row = AlarmAudit.objects.order_by("-pk").first()
    assert row is not None
    assert (row.action, row.actor, row.reason, row.host_id) == (
        case.audit_action,
        "operator",
        "on-call fix",
        host.pk,
    )
    assert case.done(host, clock, runtime)
    assert any(host.key in message for message in messages_of(done)), messages_of(done)
    assert "on-call fix" in done.content.decode()  # the audit trail on the host page


def test_actions__empty_reason_is_refused_and_changes_nothing(
    operator_client: Client, host: Host, clock: FakeClock, runtime: ScriptedRuntime, case: Case
) -> None:
    pk = case.setup(host, clock, runtime)
    before = _snapshot(host)

    for reason in ("", "   "):
        response = post_action(
            operator_client,
            case.model,
            case.action,
            [pk],
            post="yes",
            reason=reason,
            **case.data(clock),
        )
        assert response.status_code == 200
        assert "This field is required." in response.content.decode()
        assert any("Nothing was changed" in m for m in messages_of(response))
        assert _snapshot(host) == before


def test_actions__without_repair_permission_nothing_is_offered(
    viewer_client: Client, host: Host, clock: FakeClock, runtime: ScriptedRuntime, case: Case
) -> None:
    case.setup(host, clock, runtime)
    html = viewer_client.get(changelist(case.model)).content.decode()
    assert f'value="{case.action}"' not in html
    assert 'name="action"' not in html  # no action bar at all (nothing else to act on)


def test_actions__posting_without_repair_permission_has_no_effect(
    viewer_client: Client, host: Host, clock: FakeClock, runtime: ScriptedRuntime, case: Case
) -> None:
    pk = case.setup(host, clock, runtime)
    before = _snapshot(host)

    for extra in ({}, {"post": "yes", "reason": "sneaky"}):
        response = post_action(
            viewer_client, case.model, case.action, [pk], **extra, **case.data(clock)
        )
        assert response.status_code == 200  # the changelist again, not a confirmation page
        assert "admin/change_list.html" in [t.name for t in response.templates]
        assert _snapshot(host) == before


def test_actions__refuse_a_direct_call_without_permission(
    viewer: User, host: Host, case: Case
) -> None:
    """Defence in depth: the action functions check the permission themselves."""
    model_admin = next(ma for m, ma in site._registry.items() if m._meta.model_name == case.model)
    request = RequestFactory().post("/", {"post": "yes", "reason": "x"})
    for user in (viewer, AnonymousUser()):
        request.user = user
        with pytest.raises(PermissionDenied):
            getattr(model_admin, case.action)(request, model_admin.model.objects.none())


def test_rearm_at__more_than_five_minutes_in_the_past_is_refused(
    operator_client: Client, host: Host, clock: FakeClock
) -> None:
    _owing(host, clock, None)  # type: ignore[arg-type]
    before = _snapshot(host)

    response = post_action(
        operator_client,
        "host",
        "rearm_at",
        [host.pk],
        post="yes",
        reason="backfill",
        at=_iso(clock, minutes=-5, seconds=-1),
    )

    assert response.status_code == 200
    assert "more than 5 minutes in the past" in response.content.decode()
    assert any("Nothing was changed" in m for m in messages_of(response))
    assert _snapshot(host) == before


def test_rearm_at__a_recent_past_time_is_accepted(
    operator_client: Client, host: Host, clock: FakeClock
) -> None:
    _owing(host, clock, None)  # type: ignore[arg-type]
    post_action(
        operator_client,
        "host",
        "rearm_at",
        [host.pk],
        post="yes",
        reason="fire it now",
        at=_iso(clock, minutes=-4),
    )
    assert alarm.scheduled(host) == clock.now() - timedelta(minutes=4)
    assert AlarmAudit.objects.get().new_deadline == clock.now() - timedelta(minutes=4)


def test_rearm_at__an_offset_is_honoured(
    operator_client: Client, host: Host, clock: FakeClock
) -> None:
    _owing(host, clock, None)  # type: ignore[arg-type]
    post_action(
        operator_client,
        "host",
        "rearm_at",
        [host.pk],
        post="yes",
        reason="tz",
        at="2030-01-01T02:00:30+02:00",  # = 00:00:30 UTC
    )
    assert alarm.scheduled(host) == clock.now() + timedelta(seconds=30)


@pytest.mark.parametrize("at", ["", "tomorrow", "2030-13-01T00:00:00"])
def test_rearm_at__missing_or_malformed_time_is_refused(
    operator_client: Client, host: Host, clock: FakeClock, at: str
) -> None:
    _owing(host, clock, None)  # type: ignore[arg-type]
    before = _snapshot(host)
    response = post_action(
        operator_client, "host", "rearm_at", [host.pk], post="yes", reason="x", at=at
    )
    assert response.status_code == 200
    assert any("Nothing was changed" in m for m in messages_of(response))
    assert _snapshot(host) == before


def test_rearm_at__postponing_due_work_is_refused_by_the_service(
    operator_client: Client, host: Host, clock: FakeClock
) -> None:
    _owing(host, clock, None)  # type: ignore[arg-type]  (work due in 1 minute)
    before = _snapshot(host)

    response = post_action(
        operator_client,
        "host",
        "rearm_at",
        [host.pk],
        post="yes",
        reason="later please",
        at=_iso(clock, minutes=2),
        follow=True,
    )

    errors = [m for m in messages_of(response) if "would postpone work" in m]
    assert errors
    assert errors[0].startswith(f"{host.key}: ")
    assert 'class="error"' in response.content.decode()
    assert _snapshot(host) == before


def test_rearm_now__disarms_a_host_that_owes_nothing(
    operator_client: Client, host: Host, clock: FakeClock
) -> None:
    caught_up(host)
    alarm.rearm(host, at=clock.now() + timedelta(seconds=5), reason="setup")
    post_action(operator_client, "host", "rearm_now", [host.pk], post="yes", reason="tidy")
    assert alarm.scheduled(host) is None
    assert AlarmAudit.objects.filter(actor="operator").get().new_deadline is None


def test_unpark__a_lane_that_is_not_parked_is_refused(
    operator_client: Client, host: Host, clock: FakeClock
) -> None:
    _owing(host, clock, None)  # type: ignore[arg-type]
    lane = DueLane.objects.get(host=host, lane="outbox")
    before = _snapshot(host)
    response = post_action(
        operator_client, "duelane", "unpark_lanes", [lane.pk], post="yes", reason="x", follow=True
    )
    assert any("not parked" in m for m in messages_of(response))
    assert _snapshot(host) == before


def test_run_pass_now__a_failing_pass_is_reported_and_still_audited_once(
    operator_client: Client, host: Host, clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    runtime.submit(host, "t1", behaviour="raise")
    response = post_action(
        operator_client, "host", "run_pass_now", [host.pk], post="yes", reason="x", follow=True
    )
    assert any("failed with RuntimeError" in m for m in messages_of(response))
    assert AlarmAudit.objects.filter(action="pass", actor="operator").count() == 1
    assert alarm.scheduled(host) is not None  # the failed pass left the host armed


def test_actions__several_targets_one_audit_row_each(
    operator_client: Client, clock: FakeClock
) -> None:
    from tests.factories import HostFactory

    hosts = [HostFactory() for _ in range(3)]
    for host in hosts:
        _owing(host, clock, None)  # type: ignore[arg-type]
    post_action(
        operator_client, "host", "rearm_now", [h.pk for h in hosts], post="yes", reason="all"
    )
    assert sorted(AlarmAudit.objects.values_list("host_id", flat=True)) == sorted(
        h.pk for h in hosts
    )


def test_actions__next_must_stay_on_this_site(
    operator_client: Client, host: Host, clock: FakeClock
) -> None:
    _owing(host, clock, None)  # type: ignore[arg-type]
    response = post_action(
        operator_client,
        "host",
        "rearm_now",
        [host.pk],
        post="yes",
        reason="x",
        next="https://evil.example/",
    )
    assert response.status_code == 302
    assert response["Location"] == changelist("host")
