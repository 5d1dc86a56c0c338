"""``manage.py qcluster_dev``: a live cluster that picks up a changed agent without a restart
by hand (a plain ``qcluster`` keeps running the code it started with)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import durable_agent
from durable_agent.agents import registry
from durable_agent.models import Host
from tests.procs import ROOT, database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

AGENT = """
import durable_agent

@durable_agent.agent("dev_reload", version="1")
def dev_reload(ctx, payload):
    return {{"code": {code}}}
"""


def write_agent(app: Path, code: int) -> None:
    path = app / "agents.py"
    path.write_text(AGENT.format(code=code))
    later = time.time() + code  # a new mtime, whatever the file system's resolution
    os.utime(path, (later, later))


@pytest.fixture
def dev_project(tmp_path: Path) -> Path:
    """A settings module adding an app whose ready() imports ``agents.py``."""
    app = tmp_path / "dev_reload_app"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "apps.py").write_text(
        textwrap.dedent(
            """
            from django.apps import AppConfig

            class DevReloadConfig(AppConfig):
                name = "dev_reload_app"

                def ready(self):
                    from dev_reload_app import agents  # noqa: F401
            """
        )
    )
    write_agent(app, 1)
    (tmp_path / "dev_reload_settings.py").write_text(
        "from project.settings import *  # noqa: F403\n"
        "INSTALLED_APPS = [*INSTALLED_APPS, 'dev_reload_app']  # noqa: F405\n"
    )
    return tmp_path


@contextlib.contextmanager
def dev_cluster(root: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "dev_reload_settings",
        "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)]),
        "Q_WORKERS": "1",
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster_dev"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        process.terminate()  # SIGTERM to the command alone, as a service manager's KillMode=mixed
        give_up = time.monotonic() + 60
        while (left := living(process)) and time.monotonic() < give_up:
            time.sleep(0.2)  # polling an observable condition
        if left:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail(
                f"qcluster_dev left processes running 60 s after SIGTERM:\n{left}\n"
                f"its output ended:\n{log.read_text()[-6000:]}"
            )


def living(process: subprocess.Popen[bytes]) -> str:
    """The processes of its group that are still running (zombies waiting to be reaped by
    whoever adopted them do not count), as ``ps`` lines; empty when none is left."""
    process.poll()  # reap the command itself
    listing = subprocess.run(
        ["ps", "-o", "pid=,stat=,args=", "-g", str(process.pid)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return "\n".join(
        line
        for line in listing.splitlines()
        if line.split() and not line.split()[1].startswith("Z")
    )


def wait_for(log: Path, text: str, count: int, process: subprocess.Popen[bytes]) -> None:
    give_up = time.monotonic() + 90
    while log.read_text().count(text) < count:
        assert process.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < give_up, log.read_text()[-4000:]
        time.sleep(0.1)  # polling an observable condition


def run_once(host: Host, n: int) -> object:
    receipt = durable_agent.submit(host=host, thread="t", agent="dev_reload", payload=n)
    return durable_agent.wait(receipt, timeout=60).result


def test_qcluster_dev__a_changed_agent_runs_after_the_automatic_restart(
    dev_project: Path, tmp_path: Path
) -> None:
    saved = registry.snapshot()
    registry.register("dev_reload", lambda ctx, payload: None, version="1")  # for submit()
    host = Host.objects.create(key="dev-reload")
    log = tmp_path / "qcluster_dev.log"
    try:
        with dev_cluster(dev_project, log) as process:
            wait_for(log, "] running.", 1, process)
            assert run_once(host, 1) == {"code": 1}

            write_agent(dev_project / "dev_reload_app", 2)
            wait_for(log, "] running.", 2, process)  # stopped, then started on the new code

            assert run_once(host, 2) == {"code": 2}
            assert log.read_text().count("qcluster_dev: started qcluster") == 2
    finally:
        registry.restore(saved)


class SignalledCluster:
    """A stand-in for django-q2's ``Cluster``: its start() and its stop handler each raise
    more signals in this process, as the leader receives them in a burst."""

    def __init__(self) -> None:
        self.stops: list[int] = []
        self.sentinel = None

    def start(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    def sig_handler(self, signum: int, frame: object) -> None:
        self.stops.append(signum)
        os.kill(os.getpid(), signal.SIGTERM)  # delivered inside this handler, as the second
        os.kill(os.getpid(), signal.SIGINT)  # parent-death signal and a Ctrl-C would be


def test_qcluster_dev__the_leader_stops_once_however_many_signals_arrive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note [One stop per leader] in ``durable_agent/management/commands/qcluster_dev.py``."""
    import django_q.cluster

    from durable_agent.management.commands import qcluster_dev

    made: list[SignalledCluster] = []
    monkeypatch.setattr(
        django_q.cluster, "Cluster", lambda: made.append(SignalledCluster()) or made[-1]
    )
    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        qcluster_dev.run_leader()
    finally:
        signal.signal(signal.SIGTERM, saved[0])
        signal.signal(signal.SIGINT, saved[1])
    assert [cluster.stops for cluster in made] == [[signal.SIGTERM]]
