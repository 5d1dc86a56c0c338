"""Headless Chromium for the admin's browser tests and screenshots (Playwright, no JS libs).

Chromium comes from Debian (``/usr/bin/chromium``) and Playwright from PyPI; nothing is
downloaded at test time (``playwright install`` is never run). ``scripts/install_browser.sh``
installs both. Without them the browser tests skip with a loud reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("DURABLE_AGENT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS_ENV = "DURABLE_AGENT_SCREENSHOTS"
"""Set to a folder (e.g. ``docs/images``) to keep the screenshots the browser tests take."""


skipped: list[str] = []
"""Why browser tests were skipped in this run (tests/admin/conftest.py prints a banner)."""


def _skip(reason: str) -> None:
    skipped.append(reason)
    pytest.skip(f"BROWSER TESTS SKIPPED: {reason}")


def require_browser() -> None:
    """Skip, loudly, when Playwright or Chromium is missing."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _skip(
            "the Python package 'playwright' is not installed in this venv. Run "
            "`bash scripts/install_browser.sh` (pip install playwright + Debian's chromium)."
        )
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        _skip(
            f"no Chromium executable at {CHROMIUM}. Run `bash scripts/install_browser.sh` "
            "(apt-get install chromium), or point DURABLE_AGENT_CHROMIUM at one."
        )


@contextmanager
def chromium_page(*, width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A fresh page in a fresh headless Chromium, closed afterwards."""
    from django.db import connections
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            context.set_default_timeout(15_000)
            yield context.new_page()
            context.close()
        finally:
            browser.close()
            # Note [Playwright's event loop and Django's connections]
            # While Playwright's sync API runs, this thread has a running event loop, so
            # Django keeps its connections in context-local storage, apart from the test's
            # own: ORM calls made here open a second connection. Close it before the loop
            # stops, or it outlives the test (PostgreSQL then refuses to drop the test DB).
            connections.close_all()


def screenshot(page: Any, name: str, fallback: Path) -> Path:
    """Save a full-page PNG as ``name`` in $DURABLE_AGENT_SCREENSHOTS (else ``fallback``)."""
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or fallback)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    page.screenshot(path=str(path), full_page=True)
    return path


def log_in(page: Any, base_url: str, username: str, password: str, next_path: str) -> None:
    page.goto(f"{base_url}/admin/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base_url}{next_path}")
