"""The README and docs/*.md link only to what exists: every relative link names a file of the
repository (and a heading of it, for an ``#anchor``), no link names a home nobody confirmed,
and every dotted ``durable_agent.`` path the docs show as code imports."""

from __future__ import annotations

import importlib
import re
import tomllib
import types
from pathlib import Path

import pytest

import durable_agent

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# The project has no confirmed public home: any link to a GitHub repository of that name (the
# address pyproject.toml's project.urls used to give among them) is a guess.
UNCONFIRMED_HOME = re.compile(r"https?://(www\.)?github\.com/[^)\s]*durable[-_]agent", re.I)

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without code: links shown as code are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    prose = _prose(text)
    return INLINE_LINK.findall(prose) + REFERENCE.findall(prose)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces as hyphens, a repeat
    numbered ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def dead_links(path: Path) -> list[str]:
    dead = []
    for target in links(path.read_text(encoding="utf-8")):
        if UNCONFIRMED_HOME.match(target):
            dead.append(f"{target}: an unconfirmed home")
            continue
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http(s), mailto: outside links
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists() or ROOT not in (resolved, *resolved.parents):
            dead.append(f"{target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            dead.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return dead


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs__every_link_resolves_and_none_names_an_unconfirmed_home(path: Path) -> None:
    assert dead_links(path) == []


def test_link_check__catches_dead_files_anchors_and_the_unconfirmed_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check itself: each kind of bad link is reported, good ones are not."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## The `x` part\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#the-x-part) [ok](https://django-ninja.dev)\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#nope) [home][h] `[code](not/a/link.md)`\n"
        "[outside](../elsewhere.md)\n\n"
        "[h]: https://github.com/durable-agent/durable-agent/blob/main/docs/a.md\n",
        encoding="utf-8",
    )
    assert dead_links(page) == [
        "docs/b.md: no such file in the repository",
        "docs/a.md#nope: no heading #nope in a.md",
        "../elsewhere.md: no such file in the repository",
        "https://github.com/durable-agent/durable-agent/blob/main/docs/a.md: an unconfirmed home",
    ]


def test_pyproject__names_no_unconfirmed_home() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    urls = project.get("urls", {})
    assert not [u for u in urls.values() if UNCONFIRMED_HOME.match(u)]


def test_readme__lists_every_doc() -> None:
    listed = set(links((ROOT / "README.md").read_text(encoding="utf-8")))
    for path in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{path.name}" in listed, path.name


# -- dotted paths --------------------------------------------------------------------------

DOTTED = re.compile(r"\bdurable_agent(?:\.[A-Za-z_]\w*)+")


def code_of(text: str) -> list[str]:
    return [m.group(0) for m in FENCE.finditer(text)] + INLINE_CODE.findall(text)


def _names_code(path: str) -> bool:
    """Whether ``durable_agent.<name>...`` names code: ``<name>`` is a module of the package
    or one of its attributes (not a check id like ``durable_agent.E002``, a permission like
    ``durable_agent.view_host`` or a span name like ``durable_agent.pass``)."""
    name = path.split(".")[1]
    package = ROOT / "durable_agent"
    return (
        (package / f"{name}.py").exists()
        or (package / name).is_dir()
        or hasattr(durable_agent, name)
    )


def unimportable(path: str) -> str | None:
    """Why ``path`` does not import (None when it does). Its longest module prefix must import
    under that very name, and the rest be attributes; an attribute that is a module reached
    under another name (``durable_agent.maintenance.repairs`` for
    ``durable_agent.maintenance.operators.repairs``) does not count: ``from`` that path
    ``import`` something fails."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
            break
        except ImportError:
            continue
    for i in range(cut, len(parts)):
        if not hasattr(obj, parts[i]):
            return f"{'.'.join(parts[:i])} has no attribute {parts[i]!r}"
        obj = getattr(obj, parts[i])
        if isinstance(obj, types.ModuleType) and obj.__name__ != ".".join(parts[: i + 1]):
            return f"{'.'.join(parts[: i + 1])} is {obj.__name__}, not a module of that name"
    return None


def test_docs__every_dotted_path_shown_as_code_imports() -> None:
    broken = []
    for document in DOCUMENTS:
        for code in code_of(document.read_text(encoding="utf-8")):
            for path in sorted(set(DOTTED.findall(code))):
                if _names_code(path) and (why := unimportable(path)):
                    broken.append(f"{document.relative_to(ROOT)}: {path}: {why}")
    assert broken == []


def test_dotted_path_check__catches_aliases_and_missing_names() -> None:
    assert unimportable("durable_agent.maintenance.operators.repairs.binding_retry_now") is None
    assert unimportable("durable_agent.agents.services.MAX_PAYLOAD_BYTES") is None
    assert "not a module of that name" in str(
        unimportable("durable_agent.maintenance.repairs.binding_retry_now")
    )
    assert "no attribute 'LEASE_TTL'" in str(unimportable("durable_agent.agents.leases.LEASE_TTL"))
