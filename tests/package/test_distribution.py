"""The distribution is ready for a package index: what the wheel ships and what it declares."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from tests.package.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def _metadata(wheel: Path):  # type: ignore[no-untyped-def]
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return HeaderParser().parsestr(archive.read(name).decode())


def test_wheel__ships_license_templates_static_migrations_and_py_typed(wheel: Path) -> None:
    names = _names(wheel)
    package = ROOT / "durable_agent"
    expected = {"durable_agent/py.typed"}
    for folder in ("templates", "static", "migrations"):
        expected |= {
            path.relative_to(ROOT).as_posix()
            for path in (package / folder).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
        }
    assert any(n.startswith("durable_agent/migrations/0001") for n in expected)
    assert expected - names == set()
    assert any(re.fullmatch(r"durable_agent-[^/]+\.dist-info/licenses/LICENSE", n) for n in names)
    assert not [n for n in names if n.startswith(("tests/", "project/", "bench/"))]


def test_twine_check__passes(dist_dir: Path) -> None:
    files = sorted(str(p) for p in dist_dir.iterdir() if p.suffix in (".whl", ".gz"))
    assert len(files) == 2
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_metadata__license_urls_authors_and_classifiers(wheel: Path) -> None:
    metadata = _metadata(wheel)
    assert metadata["License-Expression"] == "MIT"
    assert metadata["License-File"] == "LICENSE"
    assert metadata["Author"]
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Changelog", "Issues"} <= set(urls)
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    assert {"api", "postgres"} <= extras
    assert set(metadata.get_all("Provides-Extra")) == extras
    assert metadata["Description-Content-Type"] == "text/markdown"


def test_classifiers__match_the_django_versions_make_test_runs() -> None:
    """The Django classifiers are exactly the versions scripts/test.sh and requirements/ pin."""
    tested = {
        re.search(r"^Django==(\d+\.\d+)", (ROOT / "requirements" / f).read_text(), re.M).group(1)  # type: ignore[union-attr]
        for f in ("base.txt", "django61.txt")
    }
    classifiers = {
        c.rsplit(" :: ", 1)[1]
        for c in PYPROJECT["project"]["classifiers"]
        if c.startswith("Framework :: Django :: ")
    }
    assert classifiers == tested == {"5.2", "6.1"}
    (django,) = [d for d in PYPROJECT["project"]["dependencies"] if d.startswith("Django")]
    assert django == "Django>=5.2,!=6.0.*,<6.2"


def test_readme__documents_every_extra() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for extra in PYPROJECT["project"]["optional-dependencies"]:
        assert re.search(rf"durable-agent\[[a-z,-]*\b{extra}\b", readme), extra


def test_readme__links_are_absolute_and_name_files_of_the_repository() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    inline = re.findall(r"\]\(([^)]+)\)", readme)
    targets = inline + re.findall(r"^\[[^\]]+\]: (\S+)$", readme, re.M)
    assert targets
    base = PYPROJECT["project"]["urls"]["Homepage"] + "/blob/main/"
    for target in targets:
        assert target.startswith("https://"), f"relative link {target!r} breaks on an index"
        if target.startswith(base):
            assert (ROOT / target.removeprefix(base).split("#")[0]).is_file(), target
