#!/usr/bin/env bash
# Create (or repair) a virtualenv and install pinned requirements into it.
#
#   scripts/venv.sh PYTHON MIN_VERSION VENV REQUIREMENTS [OVERRIDES]
#
# OVERRIDES is a requirements file whose own pins (its -r/-c lines are skipped) are installed
# after REQUIREMENTS, replacing what REQUIREMENTS pinned (the Django 6.1 leg swaps Django
# this way: pip refuses one file that pins Django twice).
set -euo pipefail

python=$1 min=$2 venv=$3 requirements=$4 overrides=${5:-}
export PIP_DISABLE_PIP_VERSION_CHECK=1

at_least() {  # at_least PYTHON MIN: does PYTHON run, and is it at least MIN?
    "$1" -c "import sys; sys.exit(sys.version_info[:2] < tuple(map(int, '$2'.split('.'))))" \
        >/dev/null 2>&1
}

if ! at_least "$python" "$min"; then
    echo "error: '$python' is not a working Python >= $min." >&2
    echo "       Install one, or pass it explicitly (make ... PYTHON=/path/to/python3.11)." >&2
    exit 1
fi
if [ -e "$venv" ] && ! at_least "$venv/bin/python" "$min"; then
    echo "Recreating $venv: its interpreter is missing or older than $min."
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    echo "Creating $venv with $("$python" --version 2>&1) ($python)"
    "$python" -m venv "$venv"
fi

echo "Installing $requirements into $venv"
"$venv/bin/python" -m pip install -q -r "$requirements"
if [ -n "$overrides" ]; then
    echo "Installing the pins of $overrides into $venv"
    pins=$(mktemp)
    trap 'rm -f "$pins"' EXIT
    grep -v -E '^[[:space:]]*(-r|-c|--requirement|--constraint)([[:space:]]|=)' "$overrides" >"$pins"
    "$venv/bin/python" -m pip install -q -r "$pins"
fi
