"""``durable_agent.wait``: returns the settled submission, or raises WaitTimeout."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction

import durable_agent
from durable_agent.agents import waiting
from durable_agent.agents.errors import SubmissionNotFound, TransactionMisuse
from durable_agent.errors import DurableAgentError, InvalidInput, WaitTimeout
from durable_agent.maintenance import run_pass
from durable_agent.models import Host

pytestmark = pytest.mark.django_db(transaction=True)


def settle_later(submission_id: int, seconds: float) -> threading.Thread:
    """Abort (settle) the submission from another thread and connection after ``seconds``."""

    def target() -> None:
        try:
            time.sleep(seconds)
            durable_agent.abort(submission_id, reason="settled by the test")
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    return thread


def test_wait__returns_the_row_settled_by_another_connection(host: Host, echo: Any) -> None:
    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    other = settle_later(receipt.submission_id, 0.3)

    row = durable_agent.wait(receipt, timeout=20)
    other.join()

    assert (row.pk, row.state, row.outcome) == (receipt.submission_id, "settled", "aborted")


def test_wait__a_settled_submission_returns_at_once_by_id(host: Host, echo: Any) -> None:
    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload={"n": 1})
    run_pass(host)

    with transaction.atomic():  # already settled: no need to leave the transaction
        row = durable_agent.wait(str(receipt.submission_id), timeout=0)

    assert (row.outcome, row.result) == ("completed", {"n": 1})


def test_wait__times_out_with_a_clear_error(host: Host, echo: Any) -> None:
    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    started = time.monotonic()

    with pytest.raises(WaitTimeout) as caught:
        durable_agent.wait(receipt.submission_id, timeout=timedelta(milliseconds=300))

    assert 0.3 <= time.monotonic() - started < 5
    assert isinstance(caught.value, DurableAgentError)
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.code == "wait_timeout"
    assert (caught.value.submission, caught.value.state) == (receipt.submission_id, "ready")


def test_wait__refuses_to_wait_inside_a_transaction(host: Host, echo: Any) -> None:
    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=1)

    with transaction.atomic(), pytest.raises(TransactionMisuse):
        durable_agent.wait(receipt, timeout=1)


@pytest.mark.parametrize("timeout", [-1, float("nan"), float("inf"), "1", True])
def test_wait__a_bad_timeout_is_refused(host: Host, echo: Any, timeout: Any) -> None:
    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    with pytest.raises(InvalidInput):
        durable_agent.wait(receipt, timeout=timeout)


def test_wait__an_unknown_submission_is_not_found(db: None) -> None:
    with pytest.raises(SubmissionNotFound):
        durable_agent.wait(123456, timeout=0)
    with pytest.raises(SubmissionNotFound):
        durable_agent.wait("nope", timeout=0)


@pytest.mark.postgres
def test_wait__postgres_wakes_on_the_settlement_notification(
    host: Host, echo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the notification, wait would re-read only after 30 s.
    monkeypatch.setattr(waiting, "LISTEN_RECHECK_SECONDS", 30.0)
    receipt = durable_agent.submit(host=host, thread="t", agent="echo", payload=1)
    other = settle_later(receipt.submission_id, 0.5)
    started = time.monotonic()

    row = durable_agent.wait(receipt, timeout=20)
    other.join()

    assert row.state == "settled"
    assert time.monotonic() - started < 5


@pytest.mark.postgres
def test_wait__postgres_other_settlements_do_not_end_the_wait(
    host: Host, echo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiting, "LISTEN_RECHECK_SECONDS", 30.0)
    mine = durable_agent.submit(host=host, thread="a", agent="echo", payload=1)
    theirs = durable_agent.submit(host=host, thread="b", agent="echo", payload=1)
    other = settle_later(theirs.submission_id, 0.2)

    with pytest.raises(WaitTimeout):
        durable_agent.wait(mine, timeout=1.5)
    other.join()
