#!/usr/bin/env bash
# Print the first working Python >= 3.12 (for the Django 6.1 leg); exit 1 when there is none.
# Candidates, in order: $DJ61_PYTHON, python3.12 .. python3.14 on PATH, then pyenv's
# versions. Each is actually run: a pyenv shim on PATH may exist yet fail with
# "command not found".
set -uo pipefail

candidates=()
if [ -n "${DJ61_PYTHON:-}" ]; then
    candidates+=("$DJ61_PYTHON")
fi
for name in python3.12 python3.13 python3.14; do
    if path=$(command -v "$name"); then
        candidates+=("$path")
    fi
done
shopt -s nullglob
for path in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python; do
    candidates+=("$path")
done

for python in "${candidates[@]}"; do
    if "$python" --version >/dev/null 2>&1 &&
        "$python" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 12))' \
            >/dev/null 2>&1; then
        echo "$python"
        exit 0
    fi
done
exit 1
