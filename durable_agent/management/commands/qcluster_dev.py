"""``manage.py qcluster_dev``: django-q2's ``qcluster`` that restarts when the code changes.

For development only. A running ``qcluster`` keeps the code it started with: change an agent
and it still runs the old function (or parks the new version's work on a missing binding).
This command runs ``qcluster`` as a child process and watches every imported Python file with
Django's autoreloader (the one ``runserver`` uses): on a change it stops the cluster the way a
service manager does (SIGTERM to its leader: it finishes the running tasks) and starts it again
with the new code. ``--noreload`` runs the cluster once, like ``qcluster``. Stop it with Ctrl-C
or SIGTERM; on Linux the cluster also stops in order when the watching process is killed.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import autoreload

STOP_TIMEOUT_S = 30.0


class Command(BaseCommand):
    help = (
        "Run django-q2's qcluster and restart it whenever a Python file changes (development "
        "only; production runs qcluster under a service manager)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--noreload", action="store_true", help="run the cluster once, without reloading"
        )
        parser.add_argument("--leader", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["leader"]:  # the child run_cluster() starts
            run_leader()
            return
        # SIGTERM (as well as Ctrl-C) stops the cluster in order instead of orphaning it.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
        if options["noreload"]:
            sys.exit(self.run_cluster())
        autoreload.run_with_reloader(self.run_cluster)

    def run_cluster(self) -> int:
        """Run ``qcluster`` in a child process until it exits (or this process does)."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        cluster = subprocess.Popen(
            [sys.executable, "-m", "django", "qcluster_dev", "--leader"],
            env=env,
            preexec_fn=_die_with_parent,
        )

        def stop() -> None:
            if cluster.poll() is None:
                cluster.terminate()  # SIGTERM to the leader: the cluster stops in order
                try:
                    cluster.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    cluster.kill()

        atexit.register(stop)  # the reloader exits this process to restart it
        self.stdout.write(f"qcluster_dev: started qcluster (pid {cluster.pid}); watching files")
        return cluster.wait()


def run_leader() -> None:
    """What ``qcluster`` runs, a django-q2 ``Cluster`` started in this process, except that
    it stops once, whatever number of signals asks it to.

    Note [One stop per leader]
        django-q2's leader stops the cluster in its SIGTERM and SIGINT handler, and that
        handler is not re-entrant: a second signal landing while the first one's
        ``stop_event.set()`` holds the event's lock runs ``set()`` again on the same thread,
        which waits for that lock forever, before the sentinel was told to stop. The cluster
        then never stops. Here the leader receives its signals in bursts: the kernel sends the
        parent-death signal (``_die_with_parent``) each time the leader is handed to a new
        parent, first to another thread of the dying watcher, then to init, so SIGTERM arrives
        twice within microseconds; Ctrl-C adds SIGINT to the whole group as well. So the first
        signal stops the cluster and the later ones are ignored.
    """
    # deferred: django_q.cluster sets Django up when imported; only the leader needs it
    from django_q.cluster import Cluster

    cluster = Cluster()  # installs its own handlers, replaced just below
    stopping = False

    def stop_once(signum: int, frame: Any) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        cluster.sig_handler(signum, frame)

    signal.signal(signal.SIGTERM, stop_once)
    signal.signal(signal.SIGINT, stop_once)
    cluster.start()
    if cluster.sentinel is not None:
        cluster.sentinel.join()


def _die_with_parent() -> None:
    """In the cluster's leader, before it starts: on Linux, have the kernel send it SIGTERM
    when the process watching the files dies, even by SIGKILL (the reloader's parent kills
    it on SIGTERM), so the cluster stops in order instead of running on, orphaned (it may
    come more than once: Note [One stop per leader])."""
    with contextlib.suppress(Exception):  # not Linux: Ctrl-C still stops every process
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1
