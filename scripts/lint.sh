#!/usr/bin/env bash
# `make lint`: ruff (lint + format), mypy, Django's system checks and the migrations check,
# all against the default settings (SQLite). Runs every step, then fails if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

bin=${VENV:-.venv}/bin
unset DATABASE_URL

failed=()
step() {
    local name=$1
    shift
    printf '\n--- lint: %s\n' "$name"
    if "$@"; then
        echo "ok: $name"
    else
        echo "FAILED: $name (exit $?)"
        failed+=("$name")
    fi
}

step "ruff check" "$bin/python" -m ruff check .
step "ruff format --check" "$bin/python" -m ruff format --check .
step "mypy" "$bin/python" -m mypy
step "manage.py check" "$bin/python" manage.py check --fail-level WARNING
step "makemigrations --check" "$bin/python" manage.py makemigrations --check --dry-run

if [ ${#failed[@]} -gt 0 ]; then
    printf '\nlint FAILED: %s\n' "$(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')"
    exit 1
fi
printf '\nlint passed.\n'
