"""Code blocks of the README and docs/first-agent.md, found by what they say, not copied."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(path: Path, language: str = "python") -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [body for lang, body in FENCE.findall(text) if lang == language]


def block(path: Path, *, starts: str = "", contains: str = "") -> str:
    """The one python block of ``path`` that starts with ``starts`` and contains ``contains``."""
    found = [b for b in blocks(path) if b.startswith(starts) and contains in b]
    if len(found) != 1:
        raise LookupError(
            f"{path.name}: {len(found)} python blocks start with {starts!r} and contain "
            f"{contains!r}; expected exactly one"
        )
    return found[0]


def readme_settings() -> str:
    return block(ROOT / "README.md", starts="# settings.py")


def first_agent_settings() -> str:
    return block(ROOT / "docs" / "first-agent.md", starts="# settings.py")


def first_agent_files() -> dict[str, str]:
    """The files of the ``billing`` app the guide writes (``# billing/<name>.py`` blocks)."""
    guide = ROOT / "docs" / "first-agent.md"
    return {name: block(guide, starts=f"# billing/{name}") for name in ("agents.py",)}


def first_agent_submit() -> str:
    """Section 2 (create a host) and section 4 (submit work), as one script."""
    guide = ROOT / "docs" / "first-agent.md"
    host = block(guide, starts="from durable_agent.models import Host\n")
    submit = block(guide, starts="import durable_agent\n", contains="durable_agent.submit(")
    return host + "\n" + submit
