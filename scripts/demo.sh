#!/usr/bin/env bash
# `make demo`: migrate the SQLite database (db.sqlite3), ensure the demo superuser, seed demo
# data when `manage.py seed_demo` exists, then run a django-q2 cluster in the background and
# the development server until Ctrl-C (which ends it cleanly, status 0). Stopping either one
# stops both. SQLITE_PATH (project/settings.py) picks another database file.
#
# DEBUG is off unless DJANGO_DEBUG=1; the development server then serves the admin's static
# files itself (runserver --insecure, for this local demo only). Without DJANGO_SECRET_KEY the
# project generates a key once into the git-ignored .secret_key (project/settings.py).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${VENV:-.venv}/bin/python
PORT=${PORT:-8000}
ADDRESS=127.0.0.1
unset DATABASE_URL  # the demo always uses the embedded SQLite database
SERVE_STATIC=(--insecure)
if [ "${DJANGO_DEBUG:-0}" = 1 ]; then
    SERVE_STATIC=()  # with DEBUG on, runserver serves static files anyway
fi

say() { printf '\n==> %s\n' "$*"; }

if ! "$PY" -c 'import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))' "$ADDRESS" "$PORT" 2>/dev/null; then
    echo "error: $ADDRESS:$PORT is already in use; pick another port: make demo PORT=$((PORT + 1))" >&2
    exit 1
fi

say "Migrating db.sqlite3"
"$PY" manage.py migrate --noinput
"$PY" scripts/demo_superuser.py
if "$PY" manage.py help seed_demo >/dev/null 2>&1; then
    say "Seeding demo data (manage.py seed_demo)"
    "$PY" manage.py seed_demo
fi

SERVER_PID=""
CLUSTER_PID=""

alive() {  # alive PID: is PID running (and not a zombie)?
    local stat
    stat=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $stat != Z* ]]
}

group_alive() {  # group_alive PGID: does the process group still have a live member?
    ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { f = 1 } END { exit !f }'
}

stop() {  # stop PID NAME: SIGTERM the leader, wait up to 20 s, then SIGKILL its process group
    local pid=$1 name=$2 i
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 100); do
        group_alive "$pid" || break
        sleep 0.2
    done
    if group_alive "$pid"; then
        echo "$name did not stop within 20 s; killing it."
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    trap '' INT TERM HUP
    say "Stopping the development server and the django-q2 cluster"
    stop "$SERVER_PID" runserver
    stop "$CLUSTER_PID" qcluster
    echo "Stopped."
}
trap cleanup EXIT
# Ctrl-C is how the demo ends: a clean exit, so `make demo` adds no "Error 130" line.
trap 'exit 0' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

cat <<BANNER

==============================================================================
  durable_agent demo

  Home:      http://$ADDRESS:$PORT/  (admin, dashboard, API docs, health)
  Admin:     http://$ADDRESS:$PORT/admin/
  Username:  admin
  Password:  admin

  A django-q2 cluster (manage.py qcluster) runs in the background.
  Press Ctrl-C to stop the server and the cluster.
==============================================================================

BANNER

# Each runs in its own session (setsid) so that stop() can reach all of its processes
# (qcluster's workers, runserver's autoreloader child) through the process group.
setsid "$PY" manage.py qcluster &
CLUSTER_PID=$!
setsid "$PY" manage.py runserver ${SERVE_STATIC[@]+"${SERVE_STATIC[@]}"} "$ADDRESS:$PORT" &
SERVER_PID=$!

# The server runs in the foreground of this script; bash only runs traps between commands,
# so it waits in short sleeps. Stop when the server or the cluster exits, or when the parent
# (make, or your shell) goes away.
parent=$PPID
while :; do
    if ! alive "$SERVER_PID"; then
        rc=0
        wait "$SERVER_PID" || rc=$?
        SERVER_PID=""
        echo "The development server exited (status $rc)."
        exit "$rc"
    fi
    if ! alive "$CLUSTER_PID"; then
        echo "error: the django-q2 cluster exited unexpectedly; stopping the demo." >&2
        exit 1
    fi
    if [ "$(ps -o ppid= -p $$ | tr -d ' ')" != "$parent" ]; then
        exit 1
    fi
    sleep 1 &
    wait $! || true
done
