"""The client commands against a real `volfsm serve`: one way to name a pod, unknown pods,
a file too large, `events`, `--follow`, and `analytics serve` losing its NATS.

One service (embedded NATS, emptyDir pods only) for the module.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service.helpers import REPO_ROOT, ServeProcess, unmount_under
from volfsm.bus import NatsServer

UID = "0f2c3e4a-0000-4000-8000-0000000000a1"
POD = f"""apiVersion: v1
kind: Pod
metadata: {{name: web-0, namespace: shop, uid: {UID}}}
spec:
  volumes: [{{name: scratch, emptyDir: {{}}}}]
"""


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("operator")
    proc = ServeProcess(tmp / "svc")
    proc.workdir.mkdir()
    try:
        yield proc.start()
    finally:
        proc.kill()
        unmount_under(tmp)


def env_of(svc: ServeProcess) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VOLFSM_")}
    return {**base, "PYTHONPATH": str(REPO_ROOT), "VOLFSM_DATA_DIR": str(svc.data_dir)}


def volfsm(
    svc: ServeProcess, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "volfsm.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_of(svc),
        input=stdin,
        cwd=REPO_ROOT,
    )


def spawn(svc: ServeProcess, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "volfsm.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env_of(svc),
        cwd=REPO_ROOT,
    )


def read_until(proc: subprocess.Popen[bytes], word: str, timeout: float = 60.0) -> str:
    """What `proc` printed, read until it holds `word` (fails after `timeout`)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while word.encode() not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{word!r} not printed; got {seen!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"exited before printing {word!r}; got {seen!r}")
            seen += chunk
    return seen.decode()


def terminate(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err.decode()


def test_one_pod_named_by_namespace_name_or_uid_in_every_command(
    svc: ServeProcess, tmp_path: Path
) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text(POD)
    assert volfsm(svc, "apply", "-f", str(pod)).returncode == 0
    done = volfsm(svc, "wait", "pod", "shop/web-0", "--for", "mounted", "--follow")
    assert done.returncode == 0 and done.stdout.endswith("pod/shop/web-0 mounted\n")
    assert "Z  shop/web-0 scratch: " in done.stdout  # --follow printed the volume's state
    for ref in ("shop/web-0", UID):
        done = volfsm(svc, "wait", "pod", ref, "--for", "mounted", "--timeout", "60")
        assert (done.returncode, done.stdout) == (0, "pod/shop/web-0 mounted\n"), done.stderr
        got = volfsm(svc, "get", "pods", ref, "-o", "json")
        assert [p["uid"] for p in json.loads(got.stdout)["items"]] == [UID]
    unknown = volfsm(svc, "get", "pods", "shop/web-9")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert (
        unknown.stderr == "volfsm: error: no pod shop/web-9 on node n1; pods it has: shop/web-0\n"
    )
    gone = volfsm(svc, "delete", "pod", "web-0")  # default/web-0: not this pod
    assert gone.returncode == 2 and "no pod web-0 (uid, or default/web-0) on node n1" in gone.stderr
    deleted = volfsm(svc, "delete", "pod", UID)
    assert (deleted.returncode, deleted.stdout) == (0, "pod/shop/web-0 deleted\n")
    done = volfsm(svc, "wait", "pod", "shop/web-0", "--for", "unmounted")
    assert (done.returncode, done.stdout) == (0, "pod/shop/web-0 unmounted\n")
    again = volfsm(svc, "delete", "pod", "shop/web-0")
    assert again.returncode in (1, 2) and len(again.stderr.splitlines()) == 1


def test_a_file_too_large_is_refused_before_it_is_parsed(svc: ServeProcess, tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"{ not yaml at all: [\n" * (300_000))  # 6.3 MB of junk
    done = volfsm(svc, "apply", "-f", str(big))
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"volfsm: error: {big} is 6.0MiB, more than one command to node n1")
    assert "(4.1MiB)" in line and "split it" in line  # the embedded server's max_payload
    piped = volfsm(svc, "apply", "-f", "-", stdin=big.read_text())
    assert piped.returncode == 2
    assert piped.stderr.startswith("volfsm: error: standard input is more than one command")


def test_events_reads_the_stream_and_follows_it(svc: ServeProcess, tmp_path: Path) -> None:
    uid = UID.replace("a1", "d4")
    mine = tmp_path / "web-3.yaml"
    mine.write_text(POD.replace("web-0", "web-3").replace(UID, uid))
    assert volfsm(svc, "apply", "-f", str(mine)).returncode == 0
    assert volfsm(svc, "wait", "pod", "shop/web-3", "--for", "mounted").returncode == 0
    done = volfsm(svc, "events", "--pod", "shop/web-3", "--type", "VolumeMounted", "-o", "json")
    assert done.returncode == 0, done.stderr
    [mounted] = [json.loads(line) for line in done.stdout.splitlines()]
    assert (mounted["type"], mounted["body"]["pod_uid"]) == ("VolumeMounted", uid)
    volfsm(svc, "delete", "pod", "shop/web-3")
    volfsm(svc, "wait", "pod", "shop/web-3", "--for", "unmounted")

    tail = spawn(svc, "events", "--follow", "--pod", "shop/web-1", "--kind", "podvol")
    try:
        time.sleep(1.0)  # the consumer is set up
        pod = tmp_path / "pod.yaml"
        pod.write_text(POD.replace("web-0", "web-1").replace("a1}", "b2}"))
        assert volfsm(svc, "apply", "-f", str(pod)).returncode == 0
        seen = read_until(tail, "VolumeMounted")
        assert "PodAdded" not in seen  # --kind podvol
    finally:
        code, err = terminate(tail)
    assert code == 0 and err == ""
    volfsm(svc, "delete", "pod", "shop/web-1")
    volfsm(svc, "wait", "pod", "shop/web-1", "--for", "unmounted")


def test_get_follow_prints_changes_until_sigterm(svc: ServeProcess, tmp_path: Path) -> None:
    watch = spawn(svc, "get", "pods", "--follow")
    try:
        read_until(watch, "POD")
        pod = tmp_path / "pod.yaml"
        pod.write_text(POD.replace("web-0", "web-2").replace("a1}", "c3}"))
        assert volfsm(svc, "apply", "-f", str(pod)).returncode == 0
        read_until(watch, "shop/web-2")
    finally:
        code, _ = terminate(watch)
    assert code == 0
    volfsm(svc, "delete", "pod", "shop/web-2")
    volfsm(svc, "wait", "pod", "shop/web-2", "--for", "unmounted")


def test_analytics_serve_sigterm_after_its_nats_went_away(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats").start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLFSM_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "volfsm.cli", "analytics", "serve", "--nats", server.url,
         "--db", str(tmp_path / "store")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**env, "PYTHONPATH": str(REPO_ROOT)}, cwd=REPO_ROOT,
    )  # fmt: skip
    try:
        time.sleep(3.0)  # connected and consuming
        server.stop()
        time.sleep(2.5)  # it notices and keeps retrying
    finally:
        code, err = terminate(proc)
        server.stop()
    assert code == 0, err
    last: Any = err.strip().splitlines()[-1]
    assert last.startswith(f"volfsm analytics: stopped while NATS at {server.url} was unreachable")
    assert "Traceback" not in err
