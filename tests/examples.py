"""How many examples the protocol state machine (tests/reliability/test_state_machine.py) runs:
``PROPERTY_EXAMPLES=full`` (the default) or ``quick``.

``make test`` (scripts/test.sh) runs the full count (200) in the Django 5.2 / PostgreSQL leg and
the quick one (50) in its other legs: the thorough run happens once per ``make test`` instead of
three times, and each other leg still draws its own random examples on its database and Django
version. The API fuzz (tests/api/test_fuzz.py) keeps its full count everywhere: with half its
examples schemathesis took longer, not shorter (70 s for 288 requests against 54 s for 576)."""

from __future__ import annotations

import os

MODES = {"full": 1.0, "quick": 0.25}


def examples(full: int) -> int:
    """``full`` in the full mode, a quarter of it in the quick one."""
    mode = os.environ.get("PROPERTY_EXAMPLES", "full")
    if mode not in MODES:
        raise RuntimeError(f"PROPERTY_EXAMPLES={mode!r}: expected one of {', '.join(MODES)}")
    return max(1, round(full * MODES[mode]))
