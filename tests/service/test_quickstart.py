"""examples/quickstart.sh, run for real: driver + service + demo volume + examples, mounted.

The script leaves the service and the driver running; the test uses them
the way the script's "Try next" lines say, runs the script again (it
restarts both), then `quickstart.sh stop`. Whatever happens, at the end
both processes are stopped, and every mount and loop device under the
test's directory is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers.csidriver import cleanup_under
from tests.service.helpers import EXAMPLES, REPO_ROOT, expected_stream, read_stream
from volfsm.bus import free_port
from volfsm.cli import app
from volfsm.node import mounts

QS_NODE = "node-1"
WEB_UID = "6f1c2a4e-0000-4000-8000-00000000c51a"
PROCESSES = ("serve", "csi-driver")


def wrappers(bin_dir: Path) -> None:
    """`volfsm` and `volfsm-csi-driver` on PATH, run from this checkout."""
    bin_dir.mkdir()
    for name, module in (("volfsm", "volfsm.cli"), ("volfsm-csi-driver", "volfsm.csidriver")):
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        path.chmod(0o755)


def running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return False
    return not stat.split(") ", 1)[1].startswith("Z")


def wait_gone(pid: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def pid_of(qs: Path, name: str) -> int:
    return int((qs / f"{name}.pid").read_text())


class Quickstart:
    """Runs the script with its dir under tmp_path and this checkout's volfsm on PATH."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path / "qs"
        self.data = self.dir / "data"
        wrappers(tmp_path / "bin")
        env = {k: v for k, v in os.environ.items() if not k.startswith("VOLFSM_")}
        env.update(
            PATH=f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}",
            PYTHONPATH=str(REPO_ROOT),
            PYTHON=sys.executable,
            VOLFSM_QUICKSTART_DIR=str(self.dir),
            VOLFSM_QUICKSTART_HTTP=f"127.0.0.1:{free_port()}",
        )
        self.env = env
        self.seen: set[int] = set()

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                ["bash", str(EXAMPLES / "quickstart.sh"), *args],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
        finally:
            self.remember_pids()

    def remember_pids(self) -> None:
        for name in PROCESSES:
            with contextlib.suppress(OSError, ValueError):
                self.seen.add(pid_of(self.dir, name))

    def stop_everything(self) -> None:
        """Stop every process the script started (the service first: it drains)."""
        self.remember_pids()
        for pid in sorted(self.seen, key=lambda p: p != self._serve_pid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not wait_gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                wait_gone(pid, 10)

    def _serve_pid(self) -> int:
        try:
            return pid_of(self.dir, "serve")
        except (OSError, ValueError):
            return -1


@pytest.fixture
def quickstart(tmp_path: Path) -> Iterator[Quickstart]:
    qs = Quickstart(tmp_path)
    try:
        yield qs
    finally:
        qs.stop_everything()
        cleanup_under(tmp_path)


def test_quickstart_mounts_the_examples_and_leaves_the_service_running(
    quickstart: Quickstart,
) -> None:
    runner = CliRunner()
    qs = quickstart
    where = ["--data-dir", str(qs.data)]

    # Act: the README's first command (after pip install .)
    done = qs.run()

    # Assert: mounted, pods and stream shown, next steps printed, both processes running
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for line in (
        "persistentvolume/demo-pv created",
        "pod/default/scratch mounted",
        "pod/default/web mounted",
        "JetStream stream VOLFSM holds",
        f"volfsm timeline --pod {WEB_UID}",
        "quickstart.sh stop",
        str(qs.dir / "serve.log"),
    ):
        assert line in out, out
    assert "VolumeMounted" in out.split("JetStream stream VOLFSM holds", 1)[1]
    serve_pid, driver_pid = pid_of(qs.dir, "serve"), pid_of(qs.dir, "csi-driver")
    assert running(serve_pid) and running(driver_pid)
    assert os.getsid(serve_pid) == serve_pid  # its own session: no terminal signals

    # The service answers the CLI after the script is gone
    result = runner.invoke(app, ["get", "pods", "-o", "json", *where])
    assert result.exit_code == 0, result.output
    phases = {p["name"]: p["phase"] for p in json.loads(result.stdout)["items"]}
    assert phases == {"scratch": "Mounted", "web": "Mounted"}
    assert mounts.mounts_under(qs.data / "root")

    # The "Try next" commands work
    result = runner.invoke(app, ["explain", "pod", "default/web", *where])
    assert result.exit_code == 0, result.output
    assert "Mounted" in result.stdout
    result = runner.invoke(app, ["timeline", "--pod", WEB_UID, "-o", "json", *where])
    assert result.exit_code == 0, result.output
    url = (qs.data / "nats.url").read_text().strip()

    def stream_equals_log() -> bool:
        from events.log import EventLog

        log = EventLog(qs.data / "volfsm.db", readonly=True)
        try:
            want = expected_stream(log, QS_NODE)
        finally:
            log.close()
        return read_stream(url, QS_NODE) == want

    until(stream_equals_log, "the stream to hold the whole log")

    # Act: run it again while it runs: it restarts both and everything is mounted again
    again = qs.run()
    assert again.returncode == 0, again.stdout + again.stderr
    assert "stopping the quickstart that is already running" in again.stdout
    assert "pod/default/web mounted" in again.stdout
    assert not running(serve_pid) and not running(driver_pid)
    serve_pid = pid_of(qs.dir, "serve")

    # Act: stop
    stopped = qs.run("stop")

    # Assert: pods deleted and unmounted, the service drained, the driver stopped
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "pod/default/web unmounted" in stopped.stdout
    assert not (qs.dir / "serve.pid").exists() and not (qs.dir / "csi-driver.pid").exists()
    assert not running(serve_pid)
    assert mounts.mounts_under(qs.dir) == []
    last = json.loads((qs.dir / "serve.log").read_text().splitlines()[-1])
    assert last["message"] == "volfsm serve stopped"
