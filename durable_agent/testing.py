"""Helpers for tests of durable_agent and of the projects that use it.

``fake_clock`` pins the time every service reads (gate, pass, alarm, runtime leases), so tests
never sleep; ``fake_random`` pins the backoff jitter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from durable_agent import clock as _clock

__all__ = [
    "FakeClock",
    "FakeRandom",
    "ScriptedRuntime",
    "ScriptedSubmission",
    "fake_clock",
    "fake_random",
    "installed_runtime",
]


class FakeClock:
    """A manually advanced clock. Thread-safe: passes may read it from worker threads."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2030, 1, 1, tzinfo=UTC)
        if timezone.is_naive(start):
            raise ValueError("FakeClock needs an aware start datetime")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        return self.now()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, *, ms: float = 0, seconds: float = 0, minutes: float = 0) -> datetime:
        """Move the clock forward and return the new time."""
        delta = timedelta(milliseconds=ms, seconds=seconds, minutes=minutes)
        if delta < timedelta(0):
            raise ValueError("A FakeClock only moves forward")
        with self._lock:
            self._now += delta
            return self._now

    def set(self, when: datetime) -> datetime:
        """Jump to ``when`` (not earlier than now)."""
        with self._lock:
            if when < self._now:
                raise ValueError("A FakeClock only moves forward")
            self._now = when.astimezone(UTC)
            return self._now


class FakeRandom:
    """Returns the given values in turn (the last one repeats)."""

    def __init__(self, values: Iterable[float] = (0.0,)) -> None:
        self._values = list(values) or [0.0]
        self._index = 0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            value = self._values[min(self._index, len(self._values) - 1)]
            self._index += 1
            return value


@contextmanager
def fake_clock(start: datetime | None = None) -> Iterator[FakeClock]:
    """Install a :class:`FakeClock` for every service until the block exits."""
    fake = FakeClock(start)
    previous_clock, previous_rng = _clock.install(fake, _clock._random_override)
    try:
        yield fake
    finally:
        _clock.install(previous_clock, _clock._random_override)
        del previous_rng


@contextmanager
def fake_random(values: Iterable[float] | float = 0.0) -> Iterator[Callable[[], float]]:
    """Pin the jitter source: a constant or a sequence of values in [0, 1)."""
    rng = FakeRandom([values] if isinstance(values, (int, float)) else values)
    previous_clock, previous_rng = _clock.install(_clock._clock_override, rng)
    try:
        yield rng
    finally:
        _clock.install(_clock._clock_override, previous_rng)
        del previous_clock


# -- a scriptable in-memory runtime -------------------------------------------------------


class ScriptedSubmission:
    """One submission of a :class:`ScriptedRuntime`; ``behaviour`` says what its attempt does.

    Behaviours: ``"settle"`` (completes), ``"fail"`` (settles failed), ``"hang"`` (the attempt
    returns without settling), ``"binding"`` (raises BindingUnavailable), ``"raise"`` (the
    attempt raises RuntimeError), or a callable ``(submission) -> str | None`` returning the
    outcome to settle with (None = no settlement).
    """

    def __init__(
        self, host_id: int, thread: str, submission: str, state: str, behaviour: object
    ) -> None:
        self.host_id = host_id
        self.thread = thread
        self.submission = submission
        self.state = state
        self.behaviour = behaviour
        self.outcome: str | None = None
        self.attempts = 0
        self.settlements = 0

    @property
    def settled(self) -> bool:
        return self.state == "settled"

    def __repr__(self) -> str:
        return f"<{self.thread}/{self.submission} {self.state}>"


class ScriptedRuntime:
    """An in-memory runtime tests can drive (it implements ``durable_agent.runtime.Runtime``).

    Admissions go through the real gate (one ``gate.transaction`` with native progress), so the
    maintenance state, lanes and alarm behave exactly as with a real runtime::

        runtime = ScriptedRuntime()
        with installed_runtime(runtime):
            runtime.submit(host, "t1", behaviour="settle")
            run_pass(host)
    """

    def __init__(self, registry_key: str = "registry-1") -> None:
        self.registry_key = registry_key
        self.submissions: list[ScriptedSubmission] = []
        self.recovery_pages: dict[tuple[int, str], list[object]] = {}
        self.abort_intents: dict[str, object] = {}
        self.owners: dict[int, set[str]] = {}
        self.calls: list[tuple[str, ...]] = []
        self._sequence = 0
        self._lock = threading.RLock()

    # -- scripting -------------------------------------------------------------------------

    def submit(
        self,
        host: object,
        thread: str,
        *,
        behaviour: object = "settle",
        state: str = "ready",
        submission: str | None = None,
        admit: bool = True,
    ) -> ScriptedSubmission:
        """Queue a submission on ``thread``; with ``admit`` it is admitted through the gate."""
        # deferred: Django - conftest imports this module before the app registry is ready
        from durable_agent.maintenance import gate
        from durable_agent.maintenance.lane_ids import NATIVE
        from durable_agent.maintenance.store.transactions import resolve_host_id

        host_id = resolve_host_id(host)  # type: ignore[arg-type]
        with self._lock:
            self._sequence += 1
            item = ScriptedSubmission(
                host_id, thread, submission or f"s{self._sequence}", state, behaviour
            )
        if admit:
            with gate.transaction(host_id) as tx:
                tx.record_progress([NATIVE])
        with self._lock:
            self.submissions.append(item)
        return item

    def script_recovery(self, host: object, thread: str, *sweeps: object) -> None:
        """Queue the sweeps ``run_recovery`` returns for ``thread`` (then empty sweeps)."""
        # deferred: Django - conftest imports this module before the app registry is ready
        from durable_agent.maintenance.store.transactions import resolve_host_id

        key = (resolve_host_id(host), thread)  # type: ignore[arg-type]
        with self._lock:
            self.recovery_pages.setdefault(key, []).extend(sweeps)
            self.owners.setdefault(key[0], set()).add(thread)

    def nonterminal(self, host_id: int, thread: str | None = None) -> list[ScriptedSubmission]:
        with self._lock:
            return [
                s
                for s in self.submissions
                if s.host_id == host_id and not s.settled and (thread is None or s.thread == thread)
            ]

    # -- the runtime protocol --------------------------------------------------------------

    def binding_registry_key(self) -> str:
        return self.registry_key

    def scan_nonterminal(self, host: Any) -> list[Any]:
        # deferred: Django - conftest imports this module before the app registry is ready
        from durable_agent.runtime import WorkItem

        self.calls.append(("scan_nonterminal", host.key))
        return [WorkItem(s.thread, s.submission, s.state) for s in self.nonterminal(host.pk)]

    def discover_work_threads(self, host: Any, after: str | None, limit: int) -> Any:
        # deferred: Django - conftest imports this module before the app registry is ready
        from durable_agent.runtime import DiscoveryPage

        self.calls.append(("discover_work_threads", host.key))
        with self._lock:
            owners = sorted(
                t for t in self.owners.get(host.pk, set()) if after is None or t > after
            )
        page = owners[:limit]
        return DiscoveryPage(tuple(page), page[-1] if len(owners) > limit else None)

    def run_recovery(self, host: Any, thread: str, cursor: str | None) -> Any:
        # deferred: Django - conftest imports this module before the app registry is ready
        from durable_agent.runtime import RecoverySweep

        self.calls.append(("run_recovery", thread, str(cursor)))
        with self._lock:
            pages = self.recovery_pages.get((host.pk, thread), [])
            sweep = pages.pop(0) if pages else RecoverySweep()
            if not pages:
                self.owners.get(host.pk, set()).discard(thread)
        if isinstance(sweep, BaseException):
            raise sweep
        if callable(sweep):
            sweep = sweep(cursor)
        return sweep

    def process_thread_head(self, host: Any, thread: str, yield_after: datetime) -> Any:
        # deferred: Django - conftest imports this module before the app registry is ready
        from durable_agent.errors import BindingUnavailable
        from durable_agent.maintenance import gate
        from durable_agent.maintenance.lane_ids import NATIVE
        from durable_agent.runtime import Settlement

        self.calls.append(("process_thread_head", thread))
        pending = self.nonterminal(host.pk, thread)
        if not pending:
            return None
        head = pending[0]
        head.attempts += 1
        behaviour = head.behaviour
        if behaviour == "binding":
            raise BindingUnavailable(
                f"No binding for {head.submission}", submission=head.submission
            )
        if behaviour == "raise":
            raise RuntimeError(f"attempt of {head.submission} failed")
        if behaviour == "hang":
            return None
        if callable(behaviour):
            outcome = behaviour(head)
        else:
            outcome = "failed" if behaviour == "fail" else "completed"
        if outcome is None:
            return None
        head.state, head.outcome = "settled", str(outcome)
        head.settlements += 1
        with gate.transaction(host) as tx:  # settlement is source progress on the native lane
            tx.record_progress([NATIVE])
        return Settlement(thread, head.submission, str(outcome))

    def read_abort_intent(self, host: Any, submission: str) -> object | None:
        return self.abort_intents.get(submission)


@contextmanager
def installed_runtime(runtime: Any) -> Iterator[Any]:
    """Make ``runtime`` the one every pass uses until the block exits."""
    # deferred: Django - conftest imports this module before the app registry is ready
    from durable_agent import runtime as runtime_module

    previous = runtime_module.install(runtime)
    try:
        yield runtime
    finally:
        runtime_module.install(previous)
