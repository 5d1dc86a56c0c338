"""Code blocks of the README and docs/first-agent.md, found by what they say, not copied."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(path: Path, language: str = "python") -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [body for lang, body in FENCE.findall(text) if lang == language]


def block(path: Path, *, starts: str = "", contains: str = "", language: str = "python") -> str:
    """The one ``language`` block of ``path`` that starts with ``starts`` and contains
    ``contains``."""
    found = [b for b in blocks(path, language) if b.startswith(starts) and contains in b]
    if len(found) != 1:
        raise LookupError(
            f"{path.name}: {len(found)} {language} blocks start with {starts!r} and contain "
            f"{contains!r}; expected exactly one"
        )
    return found[0]


def section_blocks(path: Path, heading: str) -> list[tuple[str, str]]:
    """The fenced blocks (language, body) of the section under ``heading``, in order."""
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return FENCE.findall(text[start : end if end != -1 else None])


def readme_wheel_install() -> str:
    """The README's command that installs the built wheel with extras, as written."""
    install = block(ROOT / "README.md", contains="python -m build", language="sh")
    (line,) = [
        line for line in install.splitlines() if line.startswith("pip install") and ")[" in line
    ]
    return line.split("  #", 1)[0].strip()


def readme_urls() -> str:
    return block(ROOT / "README.md", starts="# urls.py")


def readme_commands() -> str:
    return block(ROOT / "README.md", starts="python manage.py migrate", language="sh")


def first_agent_setup() -> list[tuple[str, str]]:
    """Section 1 of docs/first-agent.md: its shell and settings blocks, in order."""
    return section_blocks(ROOT / "docs" / "first-agent.md", "## 1. Install the app")


def health_check_snippets() -> tuple[str, str]:
    """docs/operations.md's django-health-check settings and urls blocks."""
    operations = ROOT / "docs" / "operations.md"
    return (
        block(operations, starts="# settings.py", contains='"health_check"'),
        block(operations, starts="# urls.py", contains="HealthCheckView"),
    )


def readme_settings() -> str:
    return block(ROOT / "README.md", starts="# settings.py")


def first_agent_settings() -> str:
    (settings,) = [b for lang, b in first_agent_setup() if lang == "python"]
    return settings


RETRYING_IMPORT = re.compile(r"\(imported from billing/agents\.py: `([^`]+)`\)")


def first_agent_files() -> dict[str, str]:
    """The files of the ``billing`` app the guide writes (``# billing/<name>.py`` blocks):
    section 3's ``agents.py``, and section 14's ``retrying.py`` with the import its first
    line says to add to ``agents.py``, added there as written."""
    guide = ROOT / "docs" / "first-agent.md"
    names = ("agents.py", "retrying.py")
    files = {name: block(guide, starts=f"# billing/{name}") for name in names}
    match = RETRYING_IMPORT.search(files["retrying.py"].splitlines()[0])
    if match is None:
        raise LookupError(f"{guide.name}: billing/retrying.py does not say how it is imported")
    files["agents.py"] += match.group(1) + "\n"
    return files


def first_agent_submit() -> str:
    """Section 2 (create a host) and section 4 (submit work), as one script."""
    guide = ROOT / "docs" / "first-agent.md"
    host = block(guide, starts="from durable_agent.models import Host\n")
    submit = block(guide, starts="import durable_agent\n", contains="durable_agent.submit(")
    return host + "\n" + submit


def first_agent_delayed_wait() -> tuple[str, str]:
    """Section 14's delayed submission and ``wait``: the block, and the output its last
    comment line shows (``# settled ...``)."""
    guide = ROOT / "docs" / "first-agent.md"
    body = block(guide, starts="# delayed submission and wait")
    expected = body.rstrip().splitlines()[-1]
    if not expected.startswith("# settled "):
        raise LookupError(f"{guide.name}: the delayed submission block shows no output line")
    return body, expected.removeprefix("# ")
