"""examples/quickstart.sh: driver + service + demo volume + examples, mounted, then stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.csidriver import cleanup_under
from tests.service.helpers import EXAMPLES, REPO_ROOT
from volfsm.natsutil import free_port


def wrappers(bin_dir: Path) -> None:
    """`volfsm` and `volfsm-csi-driver` on PATH, run from this checkout."""
    bin_dir.mkdir()
    for name, module in (("volfsm", "volfsm.cli"), ("volfsm-csi-driver", "volfsm.csidriver")):
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        path.chmod(0o755)


def wait_gone(pid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        if stat.split(") ", 1)[1].startswith("Z"):
            return
        assert time.monotonic() < deadline, f"process {pid} did not exit"
        time.sleep(0.05)


def test_quickstart_mounts_the_examples(tmp_path: Path) -> None:
    qs = tmp_path / "qs"
    wrappers(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLFSM_")}
    env.update(
        PATH=f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}",
        PYTHONPATH=str(REPO_ROOT),
        PYTHON=sys.executable,
        VOLFSM_QUICKSTART_DIR=str(qs),
        VOLFSM_QUICKSTART_HTTP=f"127.0.0.1:{free_port()}",
    )
    try:
        done = subprocess.run(
            ["bash", str(EXAMPLES / "quickstart.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "pod/default/scratch mounted" in done.stdout
        assert "pod/default/web mounted" in done.stdout
        assert "persistentvolume/demo-pv created" in done.stdout
    finally:
        pid_files = [qs / f"{name}.pid" for name in ("serve", "csi-driver")]
        pids = [int(f.read_text()) for f in pid_files if f.exists()]
        for pid in pids:  # the service first: it drains, then the driver
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            wait_gone(pid)
        cleanup_under(tmp_path)
    last = json.loads((qs / "serve.log").read_text().splitlines()[-1])
    assert last["message"] == "volfsm serve stopped"
