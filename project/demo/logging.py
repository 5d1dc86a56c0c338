"""Logging for the example project: the demo's expected failures as one line each."""

from __future__ import annotations

import logging

from project.demo.agents import DemoFailure


class OneLineDemoFailures(logging.Filter):
    """Render a record whose exception is a ``DemoFailure`` as one line, without traceback.

    Both durable_agent (an agent that raised) and django-q2 (a pass that failed, its traceback
    folded into the message) log them; every other record passes unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, DemoFailure):
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        elif "project.demo.agents.DemoFailure: " in (message := record.getMessage()):
            head = message.split(" : Traceback", 1)[0]
            record.msg, record.args = f"{head} (DemoFailure)", ()
        return True
