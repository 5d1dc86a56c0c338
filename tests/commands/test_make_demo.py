"""``make demo`` ends cleanly on Ctrl-C: the server and the cluster stop, and make prints no
``Error 130`` (scripts/demo.sh)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _venv(tmp_path: Path) -> Path:
    """A venv directory for make: this interpreter's venv, with make's stamps up to date
    (so make installs nothing)."""
    venv = tmp_path / "venv"
    venv.mkdir()
    prefix = Path(sys.prefix)
    for name in ("bin", "lib", "lib64", "include", "pyvenv.cfg"):
        if (prefix / name).exists():
            (venv / name).symlink_to(prefix / name)
    for stamp in (".requirements.stamp", ".demo-requirements.stamp"):
        (venv / stamp).touch()
    return venv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_demo__ctrl_c_ends_it_cleanly(tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "SQLITE_PATH": str(tmp_path / "demo.sqlite3")}
    env.pop("DATABASE_URL", None)
    make = subprocess.Popen(
        ["make", "demo", f"VENV={_venv(tmp_path)}", f"PORT={port}"],
        cwd=ROOT,
        env=env,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert make.poll() is None, make.communicate()[0][-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "the demo never answered"
                time.sleep(0.5)
        os.killpg(make.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        out = make.communicate(timeout=60)[0]
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.communicate()
    assert "Stopped." in out
    assert "make: ***" not in out, out[-2000:]
    assert "Error 130" not in out
    with pytest.raises(urllib.error.URLError):  # the server is gone with it
        urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=2)
