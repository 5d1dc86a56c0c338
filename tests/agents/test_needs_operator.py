"""Work that waits for a person: a WARNING naming agent@version, thread and host, the
``submission_needs_operator`` signal, the audit's attention, health and metrics."""

from __future__ import annotations

import logging
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from health_check.exceptions import ServiceWarning
from prometheus_client.parser import text_string_to_metric_families

import durable_agent
from durable_agent import signals
from durable_agent.contrib.health_checks import Fleet
from durable_agent.maintenance import run_pass
from durable_agent.maintenance.operators.attention import attention
from durable_agent.maintenance.operators.audit import audit_all
from durable_agent.models import Host, Submission, SubmissionState
from durable_agent.testing import FakeClock

pytestmark = pytest.mark.django_db


@pytest.fixture
def received() -> Any:
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append({k: v for k, v in kwargs.items() if k != "signal"})

    signals.submission_needs_operator.connect(receiver, dispatch_uid="test-needs-operator")
    yield seen
    signals.submission_needs_operator.disconnect(dispatch_uid="test-needs-operator")


def operator_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "durable_agent.operators" and r.levelno == logging.WARNING
    ]


def test_needs_operator__a_suspension_is_logged_and_signalled(
    host: Host,
    clock: FakeClock,
    received: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Any,
) -> None:
    captured = django_capture_on_commit_callbacks

    @durable_agent.agent("payer", version="3")
    def payer(ctx: Any, payload: Any) -> None:
        ctx.suspend_for_approval("pay 10 EUR?")

    receipt = durable_agent.submit(host=host, thread="invoices", agent="payer", payload=None)
    with caplog.at_level(logging.WARNING), captured(execute=True):
        run_pass(host)

    (line,) = operator_lines(caplog)
    assert "payer@3" in line
    assert "'invoices'" in line
    assert repr(host.key) in line
    assert "approve" in line
    assert received == [
        {
            "host": host,
            "submission_id": receipt.submission_id,
            "thread": "invoices",
            "agent": "payer",
            "version": "3",
            "reason": "approval",
        }
    ]
    assert attention().suspended == 1


def test_needs_operator__an_unknown_outcome_is_logged_and_signalled(
    host: Host,
    clock: FakeClock,
    echo: Any,
    received: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Any,
) -> None:
    captured = django_capture_on_commit_callbacks
    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=None)
    Submission.objects.filter(pk=receipt.submission_id).update(  # a worker died mid effect
        state=SubmissionState.RUNNING,
        lease_owner="dead",
        lease_expires_at=clock.now() - timedelta(seconds=1),
        attempts=1,
        side_effect_marked=True,
    )
    with caplog.at_level(logging.WARNING), captured(execute=True):
        run_pass(host)

    assert Submission.objects.get(pk=receipt.submission_id).state == "unknown"
    (line,) = operator_lines(caplog)
    assert "echo@1" in line
    assert "'t'" in line
    assert repr(host.key) in line
    assert [r["reason"] for r in received] == ["unknown"]
    assert attention().unknown == 1


def test_needs_operator__a_missing_binding_names_agent_version_thread_and_host(
    host: Host,
    clock: FakeClock,
    echo: Any,
    received: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Any,
) -> None:
    captured = django_capture_on_commit_callbacks
    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=None)
    Submission.objects.filter(pk=receipt.submission_id).update(agent_version="9")
    with caplog.at_level(logging.WARNING), captured(execute=True):
        run_pass(host)

    (line,) = [
        r.getMessage()
        for r in caplog.records
        if r.name == "durable_agent.maintenance" and r.levelno == logging.ERROR
    ]
    assert "echo@9" in line
    assert "'t'" in line
    assert repr(host.key) in line
    assert "restart the cluster" in line
    assert [(r["reason"], r["version"]) for r in received] == [("binding", "9")]
    assert attention().binding_waits == 1


def _audit(*args: str) -> tuple[str, int]:
    out = StringIO()
    try:
        call_command("maintenance_audit", *args, stdout=out)
    except CommandError as exc:
        return out.getvalue(), exc.returncode
    return out.getvalue(), 0


def _suspended(host: Host) -> None:
    @durable_agent.agent("asks")
    def asks(ctx: Any, payload: Any) -> None:
        ctx.suspend_for_approval("ok?")

    durable_agent.submit(host=host, thread="t", agent="asks", payload=None)
    run_pass(host)


def test_needs_operator__the_audit_reports_attention_and_can_fail_on_it(
    host: Host, clock: FakeClock
) -> None:
    assert _audit("--fail-on-attention")[1] == 0
    _suspended(host)

    summary = audit_all()
    assert summary.ok
    assert summary.degraded
    assert summary.as_dict()["attention"] == {
        "unknown": 0,
        "suspended": 1,
        "binding_waits": 0,
        "failing_hosts": 0,
        "total": 1,
    }
    out, code = _audit()
    assert code == 0
    assert "ATTENTION: 1 suspended submission(s) waiting for approval" in out
    assert _audit("--fail-on-attention")[1] == 1


def test_needs_operator__health_reports_degraded_not_down(
    host: Host, clock: FakeClock, settings: Any
) -> None:
    Fleet().run()  # nothing waits
    _suspended(host)

    with pytest.raises(ServiceWarning, match="1 suspended submission"):
        Fleet().run()


def test_needs_operator__the_metric_counts_by_reason(host: Host, clock: FakeClock) -> None:
    _suspended(host)

    response = Client().get("/internal/metrics")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }

    assert samples[("durable_agent_needs_operator", (("reason", "suspended"),))] == 1
    assert samples[("durable_agent_needs_operator", (("reason", "unknown"),))] == 0
