from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction

from durable_agent.agents import leases, recovery, registry
from durable_agent.agents.runtime import ReferenceRuntime
from durable_agent.maintenance import gate
from durable_agent.models import Host, Submission, SubmissionState, Thread
from durable_agent.runtime import (
    RecoveryReport,
    RecoverySweep,
    WorkItem,
    WorkReport,
    stable_external_wait,
)
from durable_agent.testing import FakeClock
from tests.agents.conftest import generation
from tests.factories import T0, SubmissionFactory, ThreadFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def thread(host: Host) -> Thread:
    return ThreadFactory(host=host, key="t")


def running(thread: Thread, sequence: int = 1, *, expires: Any = T0, **fields: Any) -> Submission:
    return SubmissionFactory(
        thread=thread,
        sequence=sequence,
        state=SubmissionState.RUNNING,
        lease_owner="crashed-worker",
        lease_expires_at=expires,
        attempts=1,
        **fields,
    )


def fetch(row: Submission) -> Submission:
    return Submission.objects.get(pk=row.pk)


@pytest.fixture
def careful(host: Host) -> None:
    registry.register("careful", lambda ctx, payload: None, retry_safe=False)


@pytest.fixture
def idempotent(host: Host) -> None:
    registry.register("idempotent", lambda ctx, payload: None, retry_safe=True)


def test_run_recovery__expired_lease_without_side_effect_returns_to_ready(
    thread: Thread, clock: FakeClock, careful: None, reference: ReferenceRuntime
) -> None:
    row = running(thread, agent="careful")

    sweep = reference.run_recovery(thread.host, "t", None)

    assert sweep == RecoverySweep(
        reports=(RecoveryReport("t", str(row.pk), "ApplyInput", "repaired"),)
    )
    recovered = fetch(row)
    assert (recovered.state, recovered.lease_owner, recovered.lease_expires_at) == (
        "ready",
        None,
        None,
    )
    assert recovered.attempts == 1


def test_run_recovery__retry_safe_agent_after_a_side_effect_returns_to_ready(
    thread: Thread, clock: FakeClock, idempotent: None, reference: ReferenceRuntime
) -> None:
    row = running(thread, agent="idempotent", side_effect_marked=True)

    sweep = reference.run_recovery(thread.host, "t", None)

    assert sweep.reports == (RecoveryReport("t", str(row.pk), "ApplyInput", "repaired"),)
    assert fetch(row).state == SubmissionState.READY


def test_run_recovery__side_effect_of_an_unsafe_agent_becomes_unknown(
    thread: Thread, clock: FakeClock, careful: None, reference: ReferenceRuntime
) -> None:
    row = running(thread, agent="careful", side_effect_marked=True)

    sweep = reference.run_recovery(thread.host, "t", None)

    report = RecoveryReport("t", str(row.pk), "MarkUnknown", "unknown")
    assert sweep.reports == (report,)
    assert (fetch(row).state, fetch(row).lease_owner) == ("unknown", None)
    # the pass treats it as a stable wait: no alarm until resolve_unknown()
    item = WorkItem("t", str(row.pk), "unknown")
    assert stable_external_wait(item, {str(row.pk): report}) is True


@pytest.mark.parametrize(("marked", "state"), [(False, "ready"), (True, "unknown")])
def test_run_recovery__unregistered_agent_counts_as_not_retry_safe(
    thread: Thread, clock: FakeClock, reference: ReferenceRuntime, marked: bool, state: str
) -> None:
    row = running(thread, agent="gone", side_effect_marked=marked)

    reference.run_recovery(thread.host, "t", None)

    assert fetch(row).state == state


def test_run_recovery__expired_lease_with_abort_intent_settles_aborted(
    thread: Thread, clock: FakeClock, careful: None, reference: ReferenceRuntime
) -> None:
    row = running(thread, agent="careful", side_effect_marked=True, abort_requested_at=T0)

    sweep = reference.run_recovery(thread.host, "t", None)

    assert sweep.reports == (RecoveryReport("t", str(row.pk), "SettleAborted", "repaired"),)
    assert (fetch(row).state, fetch(row).outcome) == ("settled", "aborted")
    assert fetch(row).side_effect_marked is True  # kept as evidence


def test_run_recovery__live_lease_reports_when_to_come_back(
    thread: Thread, clock: FakeClock, careful: None, reference: ReferenceRuntime
) -> None:
    expires = T0 + timedelta(seconds=12)
    row = running(thread, agent="careful", expires=expires)

    sweep = reference.run_recovery(thread.host, "t", None)

    assert sweep == RecoverySweep(
        reports=(), work_reports=(WorkReport("t", "unchanged", retry_at=expires),)
    )
    assert fetch(row).lease_owner == "crashed-worker"


def test_run_recovery__lease_expiring_exactly_now_is_expired(
    thread: Thread, clock: FakeClock, careful: None, reference: ReferenceRuntime
) -> None:
    row = running(thread, agent="careful", expires=T0 + timedelta(seconds=12))
    clock.advance(seconds=12)

    reference.run_recovery(thread.host, "t", None)

    assert fetch(row).state == SubmissionState.READY


def test_run_recovery__ready_submission_with_abort_intent_settles_aborted(
    thread: Thread, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    head = SubmissionFactory(
        thread=thread, sequence=1, state=SubmissionState.SUSPENDED, approval_reason="?"
    )
    follower = SubmissionFactory(thread=thread, sequence=2, abort_requested_at=T0)

    sweep = reference.run_recovery(thread.host, "t", None)

    assert sweep.reports == (RecoveryReport("t", str(follower.pk), "SettleAborted", "repaired"),)
    assert (fetch(follower).outcome, fetch(follower).settled_at) == ("aborted", T0)
    assert fetch(head).state == SubmissionState.SUSPENDED


def test_run_recovery__unknown_is_reported_as_a_stable_wait(
    thread: Thread, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    row = SubmissionFactory(thread=thread, sequence=1, state=SubmissionState.UNKNOWN)
    before = generation(thread.host)

    sweep = reference.run_recovery(thread.host, "t", None)

    assert sweep.reports == (RecoveryReport("t", str(row.pk), "AwaitUnknownResolution", "unknown"),)
    assert generation(thread.host) == before  # nothing changed, nothing admitted


def test_run_recovery__repairs_are_native_progress(
    thread: Thread, clock: FakeClock, careful: None, reference: ReferenceRuntime
) -> None:
    running(thread, agent="careful")
    running(ThreadFactory(host=thread.host, key="u"), agent="careful")

    with gate.native_source():
        reference.run_recovery(thread.host, "t", None)
    assert generation(thread.host) == (1, 0)  # created by the gate; not advanced

    reference.run_recovery(thread.host, "u", None)
    assert generation(thread.host) == (2, 0)


def test_run_recovery__pages_of_32_with_a_cursor(
    thread: Thread, clock: FakeClock, careful: None, reference: ReferenceRuntime
) -> None:
    rows = [running(thread, sequence, agent="careful") for sequence in range(1, 41)]

    first = reference.run_recovery(thread.host, "t", None)
    assert (len(first.reports), first.cursor) == (32, "32")
    assert [fetch(r).state for r in rows].count("ready") == 32

    second = reference.run_recovery(thread.host, "t", first.cursor)
    assert (len(second.reports), second.cursor) == (8, None)
    assert {fetch(r).state for r in rows} == {"ready"}
    assert recovery.PAGE_SIZE == 32


def test_run_recovery__exactly_one_page_has_no_cursor(
    thread: Thread, clock: FakeClock, careful: None, reference: ReferenceRuntime
) -> None:
    for sequence in range(1, 33):
        running(thread, sequence, agent="careful")

    assert reference.run_recovery(thread.host, "t", None).cursor is None


def test_run_recovery__malformed_cursor_starts_over(
    thread: Thread, clock: FakeClock, careful: None, reference: ReferenceRuntime
) -> None:
    row = running(thread, agent="careful")

    sweep = reference.run_recovery(thread.host, "t", "page-two")

    assert [r.submission for r in sweep.reports] == [str(row.pk)]


def test_run_recovery__unknown_thread_is_an_empty_sweep(
    host: Host, clock: FakeClock, reference: ReferenceRuntime
) -> None:
    assert reference.run_recovery(host, "nothing", None) == RecoverySweep()


def test_run_recovery__failure_becomes_a_blocked_thread_without_payload(
    thread: Thread, clock: FakeClock, careful: None, reference: ReferenceRuntime
) -> None:
    row = running(thread, agent="careful", payload={"secret": "s3cr3t"})

    with transaction.atomic():  # the gate refuses: recovery cannot commit in here
        sweep = reference.run_recovery(thread.host, "t", None)

    assert sweep.reports == ()
    (blocked,) = sweep.blocked
    assert blocked.thread == "t"
    assert blocked.failure["operation"] == "run recovery"
    assert blocked.failure["diagnostic"]["error"] == "GateMisuse"
    assert "s3cr3t" not in repr(blocked.failure)
    assert fetch(row).state == SubmissionState.RUNNING


def test_run_recovery__a_lease_renewed_meanwhile_is_not_taken(
    thread: Thread, clock: FakeClock, careful: None
) -> None:
    row = running(thread, agent="careful")
    locked = Submission.objects.get(pk=row.pk)
    leases.renew(row.pk, "crashed-worker")  # the owner renews after recovery read the row

    report = recovery._recover(locked, "t", clock.now(), [])

    assert report is None
    assert fetch(row).state == SubmissionState.RUNNING
