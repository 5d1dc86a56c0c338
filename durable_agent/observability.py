"""Logs, traces and metrics of maintenance passes (docs/operations.md).

* ``log_extra``: the one vocabulary of ``extra`` keys on durable_agent's log records:
  ``host_key``, ``host_id``, ``lane``, ``phase``, ``action``.
* ``span``: an OpenTelemetry span when ``opentelemetry-api`` is installed (the ``[otel]``
  extra) and a tracer provider is installed, a no-op otherwise (Note [No span without a
  tracer provider]).
* ``pass_recorded``: called once per recorded pass: one INFO line (WARNING when the pass
  failed) on the ``durable_agent.maintenance`` logger, and the ``pass_finished`` signal (the
  Prometheus pass metrics of ``durable_agent.contrib.metrics`` listen to it).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from durable_agent import clock, signals
from durable_agent.errors import describe_error, type_name

if TYPE_CHECKING:
    from durable_agent.maintenance.passes.finish import PassReport
    from durable_agent.models import Host

logger = logging.getLogger("durable_agent.maintenance")

_trace: Any
_context: Any
try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - the [otel] extra is not installed
    _trace = _context = None

T = TypeVar("T")

TRACER_NAME = "durable_agent"


def log_extra(host: Host | int | None = None, **fields: Any) -> dict[str, Any]:
    """``extra`` for a log record: ``host_key`` and ``host_id`` of ``host`` (a Host, or only
    ``host_id`` for an id), then ``fields`` (``lane``, ``phase``, ``action``, ...)."""
    extra: dict[str, Any] = {}
    if isinstance(host, int):
        extra["host_id"] = host
    elif host is not None:
        extra["host_key"] = host.key
        extra["host_id"] = host.pk
    extra.update(fields)
    return extra


class _NoSpan:
    def set_attribute(self, key: str, value: Any) -> None:
        pass


@functools.cache
def _tracer() -> Any:
    """The tracer, got once: the API's proxy follows a provider installed later."""
    return _trace.get_tracer(TRACER_NAME)


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[Any]:
    """A span called ``name`` with ``attributes`` (None values left out), current for the
    block; an exception is recorded on it and re-raised. A no-op without opentelemetry, and
    while no tracer provider is installed (Note [No span without a tracer provider])."""
    if _trace is None or isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider):
        yield _NoSpan()
        return
    tracer = _tracer()
    attrs = {f"durable_agent.{k}": v for k, v in attributes.items() if v is not None}
    with tracer.start_as_current_span(
        name, attributes=attrs, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as exc:
            _record_failure(current, exc)
            raise


# Note [No span without a tracer provider]
#     With the opentelemetry API installed and no provider (no SDK set up, no
#     OTEL_PYTHON_TRACER_PROVIDER), the API's proxy tracer hands out spans that record nothing,
#     each still made, attached to the context and detached, four or more a pass (tracked by
#     ``python -m bench.pass_cost``). Nothing can read them: a non-recording span made under no
#     provider has an invalid context, as the current span already has. So until a provider is
#     installed, :func:`span` yields the same stand-in as without opentelemetry; from the first
#     span after a provider is set (``trace.set_tracer_provider``, or the
#     auto-instrumentation's), every span is the provider's. tests/observability/test_tracing.py
#     checks both.


def _record_failure(current: Any, exc: BaseException) -> None:
    """Mark ``current`` failed with ``exc`` as an ``exception`` event, never raising.

    OpenTelemetry's own recording calls ``str(exc)``, which runs agent or lane code (a
    ``__str__`` may raise anything) and would replace the failure being recorded; so the span
    is told of it through the one description that never raises (Note [Describing an error]).
    """
    try:
        description = describe_error(exc)
        current.set_status(_trace.Status(_trace.StatusCode.ERROR, description))
        current.add_event(
            "exception",
            {"exception.type": type_name(exc), "exception.message": description},
        )
    except Exception:  # the tracer failing must not hide the failure itself
        logger.warning("Recording a failure on a span failed", exc_info=True)


def in_current_trace(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn``, made to run in the caller's trace context in whatever thread runs it (a pass's
    waves run on a thread pool: their spans stay children of the pass's span)."""
    if _context is None:
        return fn
    captured = _context.get_current()

    def run() -> T:
        token = _context.attach(captured)
        try:
            return fn()
        finally:
            _context.detach(token)

    return run


def pass_recorded(
    host: Host,
    report: PassReport,
    *,
    started_at: datetime,
    error: BaseException | None,
) -> None:
    """Log, measure and signal one recorded pass. Never raises."""
    duration_s = max((clock.now() - started_at).total_seconds(), 0.0)
    try:
        level = logging.WARNING if error is not None else logging.INFO
        logger.log(
            level,
            "Pass of host %s: %s in %.3f s (settled %d, recovered %d, alarm %s)%s",
            host.key,
            report.phase,
            duration_s,
            report.settled,
            report.recovered,
            report.alarm or "unchanged",
            "" if error is None else f": {describe_error(error)}",
            extra=log_extra(
                host,
                phase=report.phase,
                action="pass",
                duration_ms=round(duration_s * 1000),
                lateness_ms=report.lateness_ms,
                settled=report.settled,
                recovered=report.recovered,
            ),
        )
        signals.send_on_commit(
            signals.pass_finished,
            sender=_pass_record(),
            host=host,
            report=report,
            duration_s=duration_s,
            error=error,
        )
    except Exception:
        logger.exception("Observing a pass failed", extra=log_extra(host, action="pass"))


def _pass_record() -> Any:
    # deferred: Django - the app registry may not be ready when this module loads
    from durable_agent.models import PassRecord

    return PassRecord
