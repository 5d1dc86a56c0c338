#!/usr/bin/env bash
# `make test`: lint, the package (python -m build, twine check), then the whole suite on SQLite
# and on PostgreSQL (Django 5.2, .venv), the built wheel's tests (tests/package: its contents
# and the docs run as tests), then again on Django 6.1 (.venv-dj61) when a Python >= 3.12
# exists. Every leg runs; the summary at the end says what passed, failed or was skipped, and
# the exit status is non-zero when anything failed.
#
# What each leg runs, so that the whole stays well under an hour on a slow 2-core machine:
# every test runs on both Django versions and on both databases, but not every pair of them.
#   Django 5.2 / SQLite       the suite; the state machine in its quick mode
#   Django 5.2 / PostgreSQL   the suite; the state machine in full (tests/examples.py)
#   Django 6.1 / SQLite       the suite; the state machine in its quick mode
#   Django 6.1 / PostgreSQL   the tests marked `postgres` (row locks, several connections or
#                             processes, live clusters; the state machine is not one of them)
#
# Environment:
#   TEST_DATABASE_URL  PostgreSQL for the PostgreSQL legs
#                      (default postgres://postgres@127.0.0.1:5432/test)
#   REQUIRE_POSTGRES=1 an unreachable PostgreSQL is a failure, not a warning (CI sets it)
#   SKIP_DJ61=1        skip the Django 6.1 legs
#   SKIP_SOAK=1        skip the chaos soak; SOAK_SECONDS sets its length (default 60)
#   DJ61_PYTHON        the Python >= 3.12 for the Django 6.1 legs (default: searched for)
#   PYTEST_ARGS        extra pytest arguments for every leg, e.g. "-x -k alarm"
#   TEST_LEG_TIMEOUT   seconds one pytest run may take (default 1800: on a slow 2-core
#                      machine the PostgreSQL leg under coverage passed 900 s at 70 %)
set -uo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
VENV_DJ61=${VENV_DJ61:-.venv-dj61}
PG_URL=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
LEG_TIMEOUT=${TEST_LEG_TIMEOUT:-1800}
read -r -a PYTEST_EXTRA <<<"${PYTEST_ARGS:-}"
COLOR=no
if [ -t 1 ]; then COLOR=yes; fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset DATABASE_URL

STARTED=$SECONDS
SUMMARY=()
FAILED=0
PG_SKIPPED=""
LOG=$(mktemp)
DIST_DIR=$(mktemp -d)
trap 'rm -f "$LOG"; rm -rf "$DIST_DIR"' EXIT

section() {
    printf '\n==============================================================================\n'
    printf '== %s\n' "$*"
    printf '==============================================================================\n'
}

record() {  # record STATUS NAME SECONDS DETAIL
    SUMMARY+=("$(printf '%-5s %-34s %5ss  %s' "$1" "$2" "$3" "$4")")
    if [ "$1" = FAIL ]; then FAILED=1; fi
}

banner() {
    printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n'
    printf '!! %s\n' "$@"
    printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n'
}

# pytest_leg NAME VENV DATABASE_URL|"" [pytest args...]
pytest_leg() {
    local name=$1 venv=$2 url=$3 start=$SECONDS rc
    shift 3
    section "$name"
    local env_args=(-u DATABASE_URL)
    if [ -n "$url" ]; then env_args=(DATABASE_URL="$url"); fi
    env "${env_args[@]}" timeout --foreground --kill-after=30 "$LEG_TIMEOUT" \
        "$venv/bin/python" -m pytest -ra --color="$COLOR" "$@" "${PYTEST_EXTRA[@]}" 2>&1 |
        tee "$LOG"
    rc=${PIPESTATUS[0]}
    # The last "=== N passed, ... in 3.2s ===" line, without colours.
    local counts
    counts=$(sed -e 's/\x1b\[[0-9;]*m//g' "$LOG" | grep -E '^=+ .* in [0-9.]+s' | tail -n1 |
        sed -E 's/^=+ //; s/ =+$//')
    case $rc in
        0) record PASS "$name" $((SECONDS - start)) "$counts" ;;
        5) record FAIL "$name" $((SECONDS - start)) "no tests collected (pytest exit 5)" ;;
        124 | 137) record FAIL "$name" $((SECONDS - start)) "timed out after ${LEG_TIMEOUT}s" ;;
        *) record FAIL "$name" $((SECONDS - start)) "pytest exit $rc: $counts" ;;
    esac
}

# command_leg NAME COMMAND...
command_leg() {
    local name=$1 start=$SECONDS
    shift
    section "$name"
    local rc=0
    "$@" || rc=$?
    if [ $rc = 0 ]; then
        record PASS "$name" $((SECONDS - start)) ""
    else
        record FAIL "$name" $((SECONDS - start)) "exit $rc"
    fi
    return $rc
}

pg_unavailable() {  # pg_unavailable NAME: record a PostgreSQL leg that cannot run
    if [ "${REQUIRE_POSTGRES:-}" = 1 ]; then
        record FAIL "$1" 0 "PostgreSQL unreachable and REQUIRE_POSTGRES=1"
    else
        record SKIP "$1" 0 "PostgreSQL unreachable (WARNING: not run)"
    fi
}

# --- Django 5.2 (.venv) -------------------------------------------------------------------
command_leg "lint (ruff, mypy, checks)" bash scripts/lint.sh

# The distribution, built once: its tests (tests/package) run in their own leg below.
BUILT=0
if command_leg "package (python -m build, twine check)" bash -c '
    "$1/bin/python" -m build --outdir "$2" . && "$1/bin/python" -m twine check --strict "$2"/*
' _ "$VENV" "$DIST_DIR"; then
    BUILT=1
fi

PROPERTY_EXAMPLES=quick pytest_leg "Django 5.2 / SQLite" "$VENV" "" --cov --cov-report= \
    --cov-fail-under=0 --ignore=tests/package

section "PostgreSQL probe ($PG_URL)"
PG_OK=0
if probe=$("$VENV/bin/python" scripts/pg_probe.py "$PG_URL" 2>&1); then
    PG_OK=1
    echo "$probe"
else
    PG_SKIPPED=$probe
    if [ "${REQUIRE_POSTGRES:-}" = 1 ]; then
        banner "ERROR: $probe" \
            "REQUIRE_POSTGRES=1: the PostgreSQL legs cannot run, so this run FAILS." \
            "Start PostgreSQL or point TEST_DATABASE_URL at one."
    else
        banner "WARNING: $probe" \
            "The PostgreSQL legs will NOT run; tests marked 'postgres' are untested." \
            "Start PostgreSQL or set TEST_DATABASE_URL (REQUIRE_POSTGRES=1 makes this fatal)."
    fi
fi

if [ $PG_OK = 1 ]; then
    PROPERTY_EXAMPLES=full pytest_leg "Django 5.2 / PostgreSQL" "$VENV" "$PG_URL" --cov \
        --cov-append --cov-report= --cov-fail-under=0 --ignore=tests/package
else
    pg_unavailable "Django 5.2 / PostgreSQL"
fi

# The built wheel: its contents and metadata, and the docs run as tests (a new project from
# the README's and docs/first-agent.md's snippets, on SQLite and, with PG_OK, PostgreSQL).
if [ $BUILT = 1 ]; then
    package_url=""
    if [ $PG_OK = 1 ]; then package_url=$PG_URL; fi
    DA_DIST_DIR=$DIST_DIR pytest_leg "package and docs (built wheel)" "$VENV" "$package_url" \
        tests/package
else
    record FAIL "package and docs (built wheel)" 0 "the build failed"
fi

# The chaos soak: live clusters, Python and HTTP producers, operators, SIGKILLs and dropped
# connections, on its own database; every error it cannot pin on a fault it injected fails it.
if [ $PG_OK = 1 ] && [ "${SKIP_SOAK:-}" != 1 ]; then
    command_leg "chaos soak (${SOAK_SECONDS:-60} s, PostgreSQL)" env \
        SOAK_DATABASE_URL="${SOAK_DATABASE_URL:-${PG_URL%/*}/durable_agent_soak}" \
        "$VENV/bin/python" -m bench.soak --seconds "${SOAK_SECONDS:-60}"
elif [ "${SKIP_SOAK:-}" = 1 ]; then
    record SKIP "chaos soak" 0 "SKIP_SOAK=1"
else
    pg_unavailable "chaos soak"
fi

# Coverage of the Django 5.2 legs together; fail_under in pyproject.toml is the floor.
command_leg "coverage (Django 5.2 legs)" "$VENV/bin/python" -m coverage report

# --- Django 6.1 (.venv-dj61, Python >= 3.12) ----------------------------------------------
if [ "${SKIP_DJ61:-}" = 1 ]; then
    section "Django 6.1"
    echo "Django 6.1 leg skipped: SKIP_DJ61=1"
    record SKIP "Django 6.1" 0 "SKIP_DJ61=1"
elif ! DJ61_PYTHON=$(bash scripts/find_python312.sh); then
    section "Django 6.1"
    echo "Django 6.1 leg skipped: no Python >= 3.12 interpreter"
    echo "(looked for \$DJ61_PYTHON, python3.12-3.14 on PATH, ~/.pyenv/versions/3.1[2-9]*)"
    record SKIP "Django 6.1" 0 "no Python >= 3.12 interpreter"
else
    if command_leg "Django 6.1 environment ($VENV_DJ61)" \
        make --no-print-directory venv-dj61 DJ61_PYTHON="$DJ61_PYTHON" VENV_DJ61="$VENV_DJ61"; then
        "$VENV_DJ61/bin/python" -c 'import sys, django; print(
            f"Python {sys.version.split()[0]}, Django {django.get_version()}")'
        command_leg "Django 6.1 checks" bash -c '
            "$1/bin/python" manage.py check --fail-level WARNING &&
                "$1/bin/python" manage.py makemigrations --check --dry-run' _ "$VENV_DJ61"
        PROPERTY_EXAMPLES=quick pytest_leg "Django 6.1 / SQLite" "$VENV_DJ61" "" \
            --ignore=tests/package
        if [ $PG_OK = 1 ]; then
            pytest_leg "Django 6.1 / PostgreSQL (marked postgres)" "$VENV_DJ61" "$PG_URL" \
                -m postgres --ignore=tests/package
        else
            pg_unavailable "Django 6.1 / PostgreSQL"
        fi
    fi
fi

# --- Summary ------------------------------------------------------------------------------
section "Summary ($((SECONDS - STARTED))s)"
printf '%s\n' "${SUMMARY[@]}"
if [ -n "$PG_SKIPPED" ]; then
    if [ "${REQUIRE_POSTGRES:-}" = 1 ]; then
        banner "ERROR: PostgreSQL was required (REQUIRE_POSTGRES=1) but is unreachable:" \
            "$PG_SKIPPED"
    else
        banner "WARNING: the PostgreSQL legs were NOT run: $PG_SKIPPED" \
            "This result covers SQLite only."
    fi
fi
if [ $FAILED = 1 ]; then
    printf '\nmake test: FAILED\n'
    exit 1
fi
if [ -n "$PG_SKIPPED" ]; then
    printf '\nmake test: passed on SQLite only (PostgreSQL NOT run)\n'
else
    printf '\nmake test: passed\n'
fi
