"""A pytest plugin (``-p tests.extras.no_ninja``) that makes django-ninja unimportable.

Loaded before Django is set up, it stands in for an install without the ``api`` extra.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType


class NoNinja(MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == "ninja" or fullname.startswith("ninja."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


for _name in [n for n in sys.modules if n == "ninja" or n.startswith("ninja.")]:
    del sys.modules[_name]
sys.meta_path.insert(0, NoNinja())
