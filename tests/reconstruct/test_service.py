"""`volfsm serve` with a real nats-server: readiness waits for reconstruction; `apply --complete`.

The first test runs the service in this process and holds reconstruction
back to see /readyz before and after it; the second runs `volfsm serve`
as a process, loses its log between two runs and drives it with the CLI.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.engine.objects import empty_dir_volume, pod
from tests.service.helpers import ServeProcess, SyncNats, unmount_under
from volfsm.bus import NatsServer, free_port
from volfsm.cli import app
from volfsm.engine.reconstruct import REASON_FOUND, ReconstructionReport, Reconstructor
from volfsm.node import mounts
from volfsm.service.config import settings_from
from volfsm.service.serve import NodeService

NODE = "n1"
EMPTY = "kubernetes.io~empty-dir"


@pytest.fixture
def make_nats(tmp_path: Path) -> Iterator[Callable[[str], NatsServer]]:
    """Start plain JetStream servers under tmp_path; all stopped at the end."""
    made: list[NatsServer] = []

    def make(name: str) -> NatsServer:
        server = NatsServer(tmp_path / name)
        made.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in made:
            server.stop()


@pytest.fixture
def nats_server(make_nats: Callable[[str], NatsServer]) -> NatsServer:
    """A plain JetStream server."""
    return make_nats("nats")


@pytest.fixture
def serves(tmp_path: Path) -> Iterator[list[ServeProcess]]:
    """`volfsm serve` processes the test starts: killed, and their mounts undone, at the end."""
    made: list[ServeProcess] = []
    try:
        yield made
    finally:
        for proc in made:
            proc.kill()
        unmount_under(tmp_path)
        assert not mounts.mounts_under(tmp_path)


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


async def test_readyz_waits_for_reconstruction(
    tmp_path: Path, nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrange: junk on the node (one orphan) in a root dir volfsm never marked, so adopted;
    # reconstruction held back until released
    root = tmp_path / "root"
    (root / "pods/o1/volumes/kubernetes.io~foo/bar").mkdir(parents=True)
    release = asyncio.Event()
    entered = asyncio.Event()
    original = Reconstructor.run

    async def held(self: Reconstructor) -> ReconstructionReport:
        entered.set()
        await release.wait()
        return await original(self)

    monkeypatch.setattr(Reconstructor, "run", held)
    port = free_port()
    settings = settings_from(
        {
            "data_dir": str(tmp_path / "data"),
            "root_dir": str(root),
            "node": NODE,
            "nats": nats_server.url,
            "http": f"127.0.0.1:{port}",
            "desired_grace": 600,
            "adopt_root_dir": True,
        },
        environ={},
    )
    service = NodeService(settings)
    starting = asyncio.create_task(service.start())
    try:
        # Assert: while reconstruction runs, /readyz says not ready and why
        async with asyncio.timeout(60):
            await entered.wait()
        status, body = await asyncio.to_thread(http_get, port, "/readyz")
        assert status == 503 and body.startswith("not ready\n")
        assert "[-] reconstruction done\n" in body and "[-] first reconcile done" in body
        assert not service.ready

        # Act: let it finish
        release.set()
        await starting
        async with asyncio.timeout(60):
            while not service.ready:
                await asyncio.sleep(0.02)

        # Assert: ready, with the counts, and the gate closed until told (an adopted root)
        status, body = await asyncio.to_thread(http_get, port, "/readyz")
        assert status == 200, body
        assert "[+] reconstruction done (0 uncertain, 1 orphans)\n" in body
        assert (
            "[i] desired state not complete: the root dir was adopted (--adopt-root-dir): "
        ) in body
        assert (
            ": no unmounts until `volfsm apply -f DIR --complete`; the grace timer does not apply"
        ) in body
        status_fields = service.status()
        assert status_fields["desired_complete"] is False
        assert status_fields["desired_gate"] == "until_told"
        assert status_fields["desired_grace_left_s"] is None
        [orphan] = status_fields["reconstruction"]["orphans"]
        assert orphan["status"] == "pending"
    finally:
        release.set()
        if not starting.done():
            starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await service.stop()


def cli(*args: str) -> str:
    """Run the CLI; assert exit 0; its stdout."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, f"{args}: exit {result.exit_code}\n{result.output}"
    return result.stdout


def until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def mem_pod(uid: str) -> dict[str, Any]:
    return pod(uid, empty_dir_volume("mem", medium="Memory"))


def test_serve_after_a_lost_log_keeps_what_apply_complete_names_and_cleans_the_rest(
    tmp_path: Path, make_nats: Callable[[str], NatsServer], serves: list[ServeProcess]
) -> None:
    # Arrange: two tmpfs pods mounted by a service; it stops (mounts stay); its log is lost
    workdir = tmp_path / "svc"
    workdir.mkdir()
    first_nats = make_nats("nats1")
    svc = ServeProcess(workdir, nats_url=first_nats.url, args=["--desired-grace", "600"])
    serves.append(svc)
    both, keep = tmp_path / "both.json", tmp_path / "keep"
    both.write_text(json.dumps([mem_pod("keep"), mem_pod("gone")]))
    keep.mkdir()
    (keep / "pod.json").write_text(json.dumps(mem_pod("keep")))
    where = ("--data-dir", str(svc.data_dir))
    svc.start()
    cli("apply", "-f", str(both), *where)
    for name in ("pod-keep", "pod-gone"):
        cli("wait", "pod", name, "--for", "mounted", "--timeout", "60", *where)
    assert svc.stop() == 0
    for path in svc.data_dir.glob("volfsm.db*"):
        path.unlink()
    gone_mem = svc.root_dir / "pods/gone/volumes" / EMPTY / "mem"
    assert mounts.find_mount(gone_mem) is not None

    # Act: start again. The relay refuses a stream that holds more of this node's events
    # than its log (it cannot tell a lost log from another node's); without
    # --restore-from-stream (test_restore_stream.py) the node starts a new history in a
    # fresh stream: here, another server.
    svc.nats_url = make_nats("nats2").url
    svc.start()

    # Assert: ready with both found; unmounts wait; `get` says so
    status, body = svc.http_get("/readyz")
    assert status == 200 and "[+] reconstruction done (2 uncertain, 0 orphans)" in body
    out = cli("get", "pods", *where)
    found = f"uid gone (found on the node) mem is Uncertain: {REASON_FOUND}: {svc.root_dir}"
    assert found in out
    assert "desired state not complete: the log was lost or replaced: " in out
    assert "nothing is unmounted until `volfsm apply -f DIR --complete`" in out

    # Act: a malformed complete request is refused and changes nothing
    nc = SyncNats(svc.url)
    try:
        raw = nc.request(f"volfsm.{NODE}.cmd.apply", b'{"objects": [], "complete": "yes"}')
    finally:
        nc.close()
    reply = json.loads(raw)
    assert reply["ok"] is False and reply["error"]["code"] == "InvalidRequest"
    assert json.loads(cli("get", "pods", "-o", "json", *where))["desired_complete"] is False

    # Act: the whole desired state is "keep"
    out = cli("apply", "-f", str(keep), "--complete", *where)

    # Assert: keep stays mounted, gone is unmounted and its pod dir removed
    assert "pod/default/pod-keep created" in out
    assert "desired state complete: volumes no pod wants may now be unmounted" in out
    cli("wait", "pod", "pod-keep", "--for", "mounted", "--timeout", "60", *where)

    def gone_is_gone() -> bool:
        items = json.loads(cli("get", "pods", "-o", "json", *where))["items"]
        return all(item["uid"] != "gone" for item in items)

    until(gone_is_gone, "pod gone cleaned up")
    until(lambda: not (svc.root_dir / "pods/gone").exists(), "gone's pod dir removed")
    assert mounts.find_mount(svc.root_dir / "pods/keep/volumes" / EMPTY / "mem") is not None
    assert svc.stop() == 0
