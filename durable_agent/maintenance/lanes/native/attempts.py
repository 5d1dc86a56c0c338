"""The native step's dispatch: attempt the selected heads while the backlog is recovered, and
record the heads that wait on their agent binding.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

from durable_agent import clock, signals
from durable_agent.errors import BindingUnavailable
from durable_agent.maintenance import backoff, failpoints
from durable_agent.maintenance.lanes.native.observe import View
from durable_agent.maintenance.lanes.native.state import Pass
from durable_agent.maintenance.lanes.recovery import recover_thread
from durable_agent.maintenance.mutations import gate
from durable_agent.maintenance.store.transactions import AlarmTx, run_alarm_transaction
from durable_agent.models import BindingRetry
from durable_agent.observability import log_extra
from durable_agent.runtime import WorkItem

logger = logging.getLogger("durable_agent.maintenance")


def dispatch(step: Pass, view: View, selected: list[str], backlog: list[str]) -> None:
    """Attempt the selected heads while the backlog is recovered; join them all."""
    futures: list[Future[int]] = []
    if clock.now() < step.yield_at:
        futures = [submit_attempt(step, view.heads[t], view.waits) for t in selected]
    failure: BaseException | None = None
    try:
        for thread in backlog:
            recover_backlog_thread(step, thread)
    except BaseException as exc:  # still join the attempts before failing the pass
        failure = exc
    for future in futures:
        try:
            value = future.result()
        except BaseException as exc:
            failure = failure or exc
            continue
        step.settled += value
        step.progressed |= value > 0
    if failure is not None:
        raise failure


def submit_attempt(step: Pass, head: WorkItem, waits: list[BindingRetry]) -> Future[int]:
    assert step.executor is not None
    return step.executor.submit(lambda: attempt(step, head, waits))


def recover_backlog_thread(step: Pass, thread: str) -> None:
    """Old-work recovery: the cursor is persisted before the work (a crash moves on)."""

    def fn(tx: AlarmTx) -> None:
        tx.state.last_recovered_thread = thread

    failpoints.hit("maintenance:select:before")
    run_alarm_transaction(step.host, "advance recovery cursor", fn)
    step.last_recovered_thread = thread
    failpoints.hit("maintenance:select:after")
    recover_thread(step.host, step.runtime, thread, step.recovery)
    with step.recovery.lock:
        step.recovery.pending.discard(thread)


def attempt(step: Pass, head: WorkItem, previous_waits: list[BindingRetry]) -> int:
    """Recover the thread, then run its head once (docs/pass.md, step 2)."""
    recover_thread(step.host, step.runtime, head.thread, step.recovery)
    binding_failure: BindingUnavailable | None = None
    settlement = None
    if head.thread not in step.recovery.faults:
        try:
            with gate.native_source():
                settlement = step.runtime.process_thread_head(step.host, head.thread, step.yield_at)
        except BindingUnavailable as exc:
            binding_failure = exc
    previous = next((w for w in previous_waits if w.submission == head.submission), None)
    if binding_failure is not None and previous is None:
        agent = getattr(binding_failure, "agent", "?")
        version = getattr(binding_failure, "version", "?")
        logger.error(
            "Thread parked until its agent binding registry changes; original work remains "
            "pending: agent %s@%s, thread %r, host %r, submission %s (deploy it, or restart the "
            "cluster if you changed its code: qcluster keeps the code it started with)",
            agent,
            version,
            head.thread,
            step.host.key,
            head.submission,
            extra=log_extra(
                step.host,
                thread_key=head.thread,
                submission_id=head.submission,
                error=str(binding_failure),
                action="binding_wait",
            ),
        )
        signals.needs_operator_on_commit(
            host_id=step.host.pk,
            submission_id=head.submission,
            thread=head.thread,
            agent=str(agent),
            version=str(version),
            reason="binding",
            log=False,
        )
    if binding_failure is not None or previous is not None:
        record_binding_wait(step, head, previous, binding_failure is not None)
    return 1 if settlement is not None else 0


def record_binding_wait(
    step: Pass, head: WorkItem, previous: BindingRetry | None, parked: bool
) -> None:
    now = clock.now()
    key = step.runtime.binding_registry_key()

    def fn(tx: AlarmTx) -> None:
        BindingRetry.objects.filter(host_id=tx.host_id, submission=head.submission).delete()
        if parked:
            BindingRetry.objects.create(
                host_id=tx.host_id,
                thread=head.thread,
                submission=head.submission,
                attempts=min(backoff.MAX_RETRY_STALLS, (previous.attempts if previous else 0) + 1),
                reported_at=previous.reported_at if previous else now,
                registry_key=key,
            )

    failpoints.hit("maintenance:binding-retry:before")
    run_alarm_transaction(step.host, "record submission binding wait", fn)
    failpoints.hit("maintenance:binding-retry:after")
