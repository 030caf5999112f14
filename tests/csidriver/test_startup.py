"""Starting and stopping the driver process: root check, bad arguments, SIGTERM."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers.csidriver import REPO_ROOT, DriverProcess

NOBODY = "65534"


def _run(args: list[str], prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [*(prefix or []), sys.executable, "-m", "volfsm.csidriver", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=REPO_ROOT,
        check=False,
    )


def test_refuses_to_start_without_root(tmp_path: Path) -> None:
    # An unprivileged uid. The interpreter may live under /root (mode 0700), so
    # the process keeps only the capability to read files; it is still not root.
    as_nobody = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "--inh-caps=+dac_read_search",
        "--ambient-caps=+dac_read_search",
    ]
    sock = tmp_path / "csi.sock"
    state = tmp_path / "state"
    done = _run(
        ["--endpoint", f"unix://{sock}", "--node-id", "n1", "--state-dir", str(state)],
        prefix=as_nobody,
    )
    assert done.returncode == 2, done.stderr
    assert "must run as root" in done.stderr
    assert f"euid {NOBODY}" in done.stderr
    assert not sock.exists() and not state.exists()


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    common = ["--node-id", "n", "--state-dir", str(tmp_path / "state")]
    good_endpoint = f"unix://{tmp_path}/c.sock"
    for args, message in (
        (["--endpoint", "tcp://127.0.0.1:1"], "unix://"),
        (["--endpoint", "unix://relative.sock"], "absolute"),
        (["--endpoint", good_endpoint, "--name", "Not_A_DNS_Name"], "DNS-like"),
    ):
        done = _run([*args, *common])
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr


def test_sigterm_stops_cleanly_and_removes_socket(tmp_path: Path) -> None:
    drv = DriverProcess(tmp_path)
    try:
        drv.start()
        assert drv.socket.exists()
        assert drv.stop() == 0
        assert not drv.socket.exists()
        # A socket left by a crash does not stop the next start.
        drv.start()
        assert drv.proc is not None
        drv.proc.kill()
        drv.wait_exit()
        assert drv.socket.exists()
        drv.start()
        assert drv.stop() == 0
    finally:
        drv.close()


def test_a_socket_another_process_listens_on_is_kept(tmp_path: Path) -> None:
    """A stale socket is replaced (above); a live one is someone else's: exit 2, untouched."""
    sock = tmp_path / "csi.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as theirs:
        theirs.bind(str(sock))
        theirs.listen(1)
        inode = sock.stat().st_ino
        done = _run(
            ["--endpoint", f"unix://{sock}", "--node-id", "n1", "--state-dir", str(tmp_path / "s")]
        )
        assert done.returncode == 2, done.stderr
        assert "is in use: another process listens on it" in done.stderr
        assert sock.stat().st_ino == inode
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(sock))  # still theirs, still listening
