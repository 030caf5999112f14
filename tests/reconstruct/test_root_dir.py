"""The root dir is volfsm's only when it can prove it: real `volfsm serve` processes, the real
CSI driver (its own call log is the witness of what was torn down), real mounts.

- one volfsm per root dir: a second service on it exits at once, naming the holder, and the
  first one's mounts, files and driver calls are as they were;
- a root dir shaped like a kubelet's that volfsm never used is refused, byte for byte untouched;
- a root dir of an older build (no mark) whose pods the log knows is marked and used;
- after a lost log the grace timer does not open the unmount gate: only `apply --complete`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from events.log import EventLog
from tests.engine.objects import empty_dir_volume, pod
from tests.helpers import csidriver as shared
from tests.helpers.csidriver import Closeable, DriverProcess, StartDriver, create_volume
from tests.reconstruct.test_log_lost import csi_pod, csi_pv
from tests.reconstruct.test_service import cli, make_nats
from tests.service.helpers import ServeProcess
from volfsm.bus import NatsServer
from volfsm.node import mounts
from volfsm.node.rootdir import LOST_REPLACED, MARK_NAME, META_DIR, RootMark

from .conftest import CSI_DRIVER

__all__ = ["make_nats"]  # fixture

MIB = 1 << 20
EMPTY = "kubernetes.io~empty-dir"
TEARDOWN_RPCS = ("NodeUnpublishVolume", "NodeUnstageVolume")
LIFT = "nothing is unmounted until `volfsm apply -f DIR --complete`"


@dataclass
class Rig:
    """Services on one host, with one CSI driver and NATS servers made on demand."""

    tmp_path: Path
    make_nats: Callable[[str], NatsServer]
    start_driver: StartDriver
    driver: DriverProcess | None = None
    services: list[ServeProcess] = field(default_factory=list)

    def service(self, name: str, node: str, nats: NatsServer, *args: str) -> ServeProcess:
        """A `volfsm serve` (not started) under tmp_path/name, with the CSI driver."""
        if self.driver is None:
            self.driver = self.start_driver(node_id=node)
        workdir = self.tmp_path / name
        workdir.mkdir(exist_ok=True)
        csi = f"{CSI_DRIVER}={self.driver.endpoint}"
        svc = ServeProcess(workdir, node=node, nats_url=nats.url, args=["--csi", csi, *args])
        self.services.append(svc)
        return svc


@pytest.fixture
def rig(
    tmp_path: Path,
    janitor: list[Closeable],
    start_driver: StartDriver,
    make_nats: Callable[[str], NatsServer],
) -> Iterator[Rig]:
    """At the end: every service killed, then its mounts and the driver's loops undone."""
    made = Rig(tmp_path, make_nats, start_driver)
    try:
        yield made
    finally:
        for svc in made.services:
            svc.kill()
        shared.cleanup_under(tmp_path)


def where(svc: ServeProcess) -> tuple[str, str]:
    return ("--data-dir", str(svc.data_dir))


def workload(handle: str) -> list[dict[str, Any]]:
    """A CSI pod `pc` (PV pv-c on `handle`, volume "data") and an emptyDir pod `pe`."""
    return [
        *csi_pv("pv-c", handle),
        csi_pod("pc", "pv-c", "data"),
        pod("pe", empty_dir_volume("scratch")),
    ]


def run_workload(rig: Rig, svc: ServeProcess, handle: str) -> dict[Path, bytes]:
    """Create the volume, apply `workload`, wait until mounted, write a file into each volume."""
    assert rig.driver is not None
    create_volume(rig.driver.clients(), handle, 32 * MIB)
    spec = rig.tmp_path / f"{handle}.json"
    spec.write_text(json.dumps(workload(handle)))
    cli("apply", "-f", str(spec), *where(svc))
    for name in ("pod-pc", "pod-pe"):
        cli("wait", "pod", name, "--for", "mounted", "--timeout", "120", *where(svc))
    data = {
        svc.root_dir / "pods/pe/volumes" / EMPTY / "scratch/data.bin": os.urandom(4096),
        svc.root_dir / "pods/pc/volumes/kubernetes.io~csi/pv-c/mount/data.bin": os.urandom(4096),
    }
    for path, content in data.items():
        path.write_bytes(content)
    return data


def tree(root: Path) -> dict[str, str]:
    """Every entry under root: a file's sha256, 'dir' or 'link -> target'."""
    found: dict[str, str] = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(base, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = f"link -> {os.readlink(path)}"
            elif path.is_dir():
                found[rel] = "dir"
            else:
                found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def mounts_of(root: Path) -> list[tuple[str, str]]:
    return sorted((m.mount_point, m.fstype) for m in mounts.mounts_under(root))


def refused(svc: ServeProcess) -> str:
    """Start a service that must refuse to start: the one error line it logged."""
    svc.start(wait_ready=False)
    assert svc.proc is not None
    assert svc.proc.wait(60) != 0
    errors = [ln["message"] for ln in svc.log_lines() if ln.get("level") == "ERROR"]
    assert len(errors) == 1, svc.stderr_tail()
    assert "\n" not in errors[0]
    return str(errors[0])


def teardown_calls(driver: DriverProcess | None) -> list[dict[str, Any]]:
    assert driver is not None
    return [c for c in driver.calls(event="start") if c.get("rpc") in TEARDOWN_RPCS]


def status(svc: ServeProcess) -> dict[str, Any]:
    reply: dict[str, Any] = json.loads(cli("get", "pods", "-o", "json", *where(svc)))
    return reply


def test_a_second_service_on_the_same_root_dir_exits_at_once_and_touches_nothing(
    rig: Rig,
) -> None:
    # Arrange: a service with a CSI pod and an emptyDir pod, files in both
    nats = rig.make_nats("nats")
    first = rig.service("a", "rd-a", nats).start()
    data = run_workload(rig, first, "vol-two")
    before, mounted = tree(first.root_dir), mounts_of(first.root_dir)
    assert len(mounted) >= 2  # the CSI staging and publish mounts

    # Act: a second service with its own data dir on the same root dir
    second = rig.service("b", "rd-b", nats)
    second.root_dir = first.root_dir
    error = refused(second)

    # Assert: it named the holder and created nothing, not even its data dir
    assert first.proc is not None
    holder = f"(pid {first.proc.pid}, node rd-a, data dir {first.data_dir})"
    assert f"root dir {first.root_dir} is in use by another volfsm serve {holder}" in error
    assert not second.data_dir.exists()
    # ...and the first service's node is as it was: mounts, files, no teardown sent
    assert first.alive()
    assert mounts_of(first.root_dir) == mounted
    assert tree(first.root_dir) == before
    for path, content in data.items():
        assert path.read_bytes() == content
    assert teardown_calls(rig.driver) == []
    pods = {item["uid"]: item["phase"] for item in status(first)["items"]}
    assert pods == {"pc": "Mounted", "pe": "Mounted"}


def kubelet_root(root: Path) -> None:
    """A root dir as a kubelet leaves it: pods with emptyDir data, etc-hosts, a CSI volume
    (its publish dir a tmpfs holding files), the CSI staging dir."""
    pod_dir = root / "pods/3f1e0c5a-1111-4b2c-9d7e-0a1b2c3d4e5f"
    (pod_dir / "volumes" / EMPTY / "cache").mkdir(parents=True)
    (pod_dir / "volumes" / EMPTY / "cache/index.db").write_bytes(os.urandom(2048))
    (pod_dir / "etc-hosts").write_text("127.0.0.1 localhost\n10.0.0.7 web-0\n")
    (pod_dir / "containers/web/0a1b2c3d").mkdir(parents=True)
    (pod_dir / "containers/web/0a1b2c3d/termination-log").write_text("")
    csi_dir = root / "pods/77aa0c5a-2222-4b2c-9d7e-0a1b2c3d4e5f/volumes/kubernetes.io~csi/pvc-9"
    (csi_dir / "mount").mkdir(parents=True)
    vol_data = {"driverName": "ebs.csi.aws.com", "volumeHandle": "vol-0abc", "specVolID": "pvc-9"}
    (csi_dir / "vol_data.json").write_text(json.dumps(vol_data))
    mounts.mount_tmpfs(csi_dir / "mount", 4 * MIB)
    (csi_dir / "mount/orders.csv").write_text("id,total\n1,42\n")
    (csi_dir / "mount/blobs").mkdir()
    (csi_dir / "mount/blobs/a.bin").write_bytes(os.urandom(1024))
    staging = root / "plugins/kubernetes.io/csi/ebs.csi.aws.com" / ("ab" * 32) / "globalmount"
    staging.mkdir(parents=True)
    (staging.parent / "vol_data.json").write_text(json.dumps(vol_data))


def test_a_kubelet_shaped_root_dir_volfsm_never_used_is_refused_untouched(rig: Rig) -> None:
    # Arrange
    svc = rig.service("k", "rd-k", rig.make_nats("nats"))
    kubelet_root(svc.root_dir)
    before, mounted = tree(svc.root_dir), mounts_of(svc.root_dir)

    # Act
    error = refused(svc)

    # Assert: refused, saying why and what to do; not one byte changed, no mark
    assert error.startswith(f"volfsm serve cannot start: root dir {svc.root_dir} is not this")
    assert "2 pod dirs (3f1e0c5a-1111-4b2c-9d7e-0a1b2c3d4e5f, 77aa0c5a-" in error
    assert "sharing a root dir with a running kubelet" in error and "--adopt-root-dir" in error
    assert tree(svc.root_dir) == before
    assert mounts_of(svc.root_dir) == mounted
    assert not (svc.root_dir / META_DIR).exists()
    assert teardown_calls(rig.driver) == []


def read_mark(svc: ServeProcess) -> RootMark:
    return RootMark.from_json((svc.root_dir / META_DIR / MARK_NAME).read_text())


def test_a_root_dir_of_an_older_build_whose_pods_the_log_knows_is_marked(rig: Rig) -> None:
    # Arrange: a pod mounted; then the node looks like one an older build ran: no mark, and
    # a log without an id
    nats = rig.make_nats("nats")
    svc = rig.service("u", "rd-u", nats)
    svc.start()
    spec = rig.tmp_path / "pod.json"
    spec.write_text(json.dumps([pod("pu", empty_dir_volume("scratch"))]))
    cli("apply", "-f", str(spec), *where(svc))
    cli("wait", "pod", "pod-pu", "--for", "mounted", "--timeout", "60", *where(svc))
    assert svc.stop() == 0
    shutil.rmtree(svc.root_dir / META_DIR)
    db = svc.data_dir / "volfsm.db"
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DELETE FROM volfsm_meta WHERE key = 'log_id'")
    conn.close()

    # Act
    svc.start()

    # Assert: marked as this node's, with the id the log was given; an intact log: the timer
    log = EventLog(db, readonly=True)
    try:
        log_id = log.log_id
    finally:
        log.close()
    mark = read_mark(svc)
    assert log_id and (mark.node, mark.log_id, mark.until_complete) == ("rd-u", log_id, "")
    notes = [ln["message"] for ln in svc.log_lines() if "had no ownership mark" in ln["message"]]
    expected = f"root dir {svc.root_dir} had no ownership mark; this log knows its pods pu"
    assert notes == [f"{expected}: marked as node rd-u's"]
    got = status(svc)
    assert got["desired_gate"] == "until_told_or_grace" and got["desired_wait_reason"] == ""
    assert {item["uid"]: item["phase"] for item in got["items"]} == {"pu": "Mounted"}


def test_after_a_lost_log_only_apply_complete_opens_the_gate_never_the_timer(rig: Rig) -> None:
    # Arrange: a CSI pod and an emptyDir pod with data; the service stops; its data dir is lost
    svc = rig.service("l", "rd-l", rig.make_nats("nats1"), "--desired-grace", "1")
    svc.start()
    data = run_workload(rig, svc, "vol-lost")
    mounted = mounts_of(svc.root_dir)
    assert svc.stop() == 0
    shutil.rmtree(svc.data_dir)
    # The old stream holds the node's history; the new log starts one in a new stream
    svc.nats_url = rig.make_nats("nats2").url

    # Act: start again, and wait well past the 1 s grace period
    svc.start()
    time.sleep(3)

    # Assert: nothing was torn down; mounts and data as they were; `get` says why and what
    # lifts the gate, so does /readyz
    assert teardown_calls(rig.driver) == []
    assert mounts_of(svc.root_dir) == mounted
    for path, content in data.items():
        assert path.read_bytes() == content
    got = status(svc)
    assert (got["desired_complete"], got["desired_gate"]) == (False, "until_told")
    assert got["desired_grace_left_s"] is None
    assert got["desired_wait_reason"].startswith("the log was lost or replaced: the root dir's")
    out = cli("get", "pods", *where(svc))
    assert f"desired state not complete: {got['desired_wait_reason']}: {LIFT}" in out
    assert "the grace timer does not apply" in out
    code, body = svc.http_get("/readyz")
    assert code == 200 and "[i] desired state not complete: the log was lost" in body

    # Act: a restart before anyone said the desired state is complete
    assert svc.stop() == 0
    svc.start()

    # Assert: the mark still holds the gate
    mark = read_mark(svc)
    assert mark.lost_kind == LOST_REPLACED and mark.until_complete
    got = status(svc)
    assert (got["desired_gate"], got["desired_grace_left_s"]) == ("until_told", None)

    # Act: the pods are applied again as the whole desired state
    spec = rig.tmp_path / "again.json"
    spec.write_text(json.dumps(workload("vol-lost")))
    cli("apply", "-f", str(spec), "--complete", *where(svc))

    # Assert: both Mounted with their data, nothing torn down; the mark no longer holds
    for name in ("pod-pc", "pod-pe"):
        cli("wait", "pod", name, "--for", "mounted", "--timeout", "120", *where(svc))
    got = status(svc)
    assert got["desired_complete"] is True and got["desired_gate"] == "open"
    assert {item["uid"]: item["phase"] for item in got["items"]} == {
        "pc": "Mounted",
        "pe": "Mounted",
    }
    for path, content in data.items():
        assert path.read_bytes() == content
    assert teardown_calls(rig.driver) == []
    assert read_mark(svc).until_complete == ""
