"""The distribution is ready for a package index: what the wheel ships and what it declares."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
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
    # No confirmed public home yet: no Project-URL at all (tests/test_docs_links.py).
    assert metadata.get_all("Project-URL") is None
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
        assert re.search(rf"^\| `{re.escape(extra)}` \|", readme, re.M), extra


def test_sdist__ships_the_package_and_docs_but_no_tests(dist_dir: Path) -> None:
    """No test module without its conftest and packages: the suite stays in the repository.
    The docs the README links to (relatively) come along, so its links work in the sdist."""
    (sdist,) = dist_dir.glob("durable_agent-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert not [n for n in names if n.startswith(("tests/", "bench/", "project/"))]
    assert not [n for n in names if re.search(r"(^|/)(test_[^/]*|conftest)\.py$", n)]
    assert {"README.md", "LICENSE", "CHANGELOG.md", "pyproject.toml"} <= names
    docs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*") if p.is_file()}
    assert docs - names == set()
    assert "durable_agent/__init__.py" in names
