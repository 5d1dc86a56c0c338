#!/usr/bin/env bash
# Install what the admin's browser tests (tests/admin/test_browser.py) need, idempotently:
#   - Debian's Chromium at /usr/bin/chromium (apt-get, only when it is missing);
#   - the Python package playwright, pinned in requirements/dev.txt, into the venv (only when
#     it is missing). `playwright install` is never run: the tests drive Debian's Chromium.
# Usage: bash scripts/install_browser.sh [VENV]   (VENV defaults to $VENV or .venv)
# Without root (or apt-get) it says what is missing and exits 1; the tests then skip loudly.
# A missing venv is not an error (make venv installs playwright from requirements/dev.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-${VENV:-.venv}}
chromium=${DURABLE_AGENT_CHROMIUM:-/usr/bin/chromium}

if [ -x "$chromium" ]; then
    echo "chromium: present ($("$chromium" --version 2>/dev/null || echo "$chromium"))"
else
    echo "chromium: missing at $chromium; installing Debian's chromium"
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "error: installing chromium needs root and apt-get (apt-get install -y chromium)" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium >/dev/null
    if [ ! -x "$chromium" ]; then
        echo "error: apt-get installed chromium, but $chromium is still missing" >&2
        exit 1
    fi
    echo "chromium: installed ($("$chromium" --version))"
fi

if [ ! -x "$venv/bin/python" ]; then
    # A fresh clone (CI): `make venv` / `make test` creates the venv from
    # requirements/dev.txt, which pins playwright.
    echo "playwright: no virtualenv at $venv yet; make venv installs it from requirements/dev.txt"
elif "$venv/bin/python" -c 'import playwright.sync_api' 2>/dev/null; then
    echo "playwright: present in $venv"
else
    pin=$(grep -E '^playwright==' requirements/dev.txt || echo playwright)
    echo "playwright: installing $pin into $venv"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q "$pin"
fi
