"""Log lost with local PVs (a directory, a filesystem on a device, a Block device) and a hostPath.

Each is found on the node through its plugin (the bind mount dirs, the
device link and global map dir, the hostPath record), reconstructed
Uncertain, and once `apply --complete` names no pod, torn down: volfsm's
binds, links and dirs go; nothing on the devices or host paths is lost.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from events.types import VolumeUnmounted
from tests.engine.helpers import eventually
from tests.engine.objects import claim_volume, pod, pvc
from tests.helpers.csidriver import mounts_at
from volfsm.engine.reconstruct import REASON_FOUND
from volfsm.node import mounts
from volfsm.node.blockmap import loop_devices_for
from volfsm.plugins.hostpath import RECORD
from volfsm.plugins.local import HOSTNAME_LABEL, global_map_path

from .conftest import GATED, NODE, Node

MIB = 1 << 20
MARKER = b"raw marker\n"
LOCAL = "kubernetes.io~local-volume"
UID = "lp"


def local_pv(name: str, path: Path | str, mode: str = "Filesystem") -> list[dict[str, Any]]:
    """A local PV on this node and its claim `name`."""
    term = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [NODE]}]}
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "16Mi"},
            "accessModes": ["ReadWriteOnce"],
            "local": {"path": str(path)},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
            "volumeMode": mode,
        },
    }
    return [volume, pvc(name, name, mode=mode)]


def loop_device(image: Path, content: bytes = b"") -> str:
    """A loop device on a new 16 MiB image holding `content` at 1 MiB (the fixture detaches it)."""
    with image.open("wb") as f:
        f.truncate(16 * MIB)
        f.seek(MIB)
        f.write(content)
    return subprocess.run(
        ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()


def read_marker(device: str) -> bytes:
    with open(device, "rb") as dev:
        dev.seek(MIB)
        return dev.read(len(MARKER))


@dataclass
class World:
    """What `arrange` set up: the objects, the pod, the host paths and devices, volfsm's paths."""

    objects: list[dict[str, Any]]
    pod: dict[str, Any]
    host: Path
    raw: str
    fsdev: str
    dir_bind: Path
    fs_bind: Path
    link: Path
    global_map: Path


async def arrange(node: Node) -> World:
    """One pod with a local PV on a directory, one with a filesystem on a device, a Block
    local PV and a hostPath; data written in each; then the log goes."""
    host = node.tmp_path / "host"
    (host / "disk").mkdir(parents=True)
    (host / "disk" / "kept.txt").write_text("local dir data")
    (host / "hp").mkdir()
    (host / "hp" / "kept.txt").write_text("host data")
    raw = loop_device(node.tmp_path / "raw.img", MARKER)
    fsdev = loop_device(node.tmp_path / "fs.img")
    objects = [
        *local_pv("pv-dir", host / "disk"),
        *local_pv("pv-fs", fsdev),
        *local_pv("pv-raw", raw, "Block"),
    ]
    volumes = [
        claim_volume("dir", "pv-dir"),
        claim_volume("fs", "pv-fs"),
        claim_volume("raw", "pv-raw"),
        {"name": "hp", "hostPath": {"path": str(host / "hp"), "type": "Directory"}},
    ]
    first = await node.start(host=True)
    await first.apply([*objects, pod(UID, *volumes)])
    await first.wait_pod(UID, "mounted", timeout=60)
    world = World(
        objects=objects,
        pod=pod(UID, *volumes),
        host=host,
        raw=raw,
        fsdev=fsdev,
        dir_bind=node.layout.pod_volume_dir(UID, LOCAL, "pv-dir"),
        fs_bind=node.layout.pod_volume_dir(UID, LOCAL, "pv-fs"),
        link=node.layout.pod_volume_device_path(UID, LOCAL, "pv-raw"),
        global_map=global_map_path(node.layout, "pv-raw"),
    )
    (world.fs_bind / "on-device.txt").write_text("fs data")
    record = node.layout.pod_volume_dir(UID, "kubernetes.io~host-path", "hp")
    assert (record / RECORD).is_file()
    await node.stop()
    node.lose_log()
    return world


def assert_data_intact(node: Node, world: World) -> None:
    """Nothing on the devices or host paths is lost."""
    host = world.host
    assert (host / "disk" / "kept.txt").read_text() == "local dir data"
    assert (host / "hp" / "kept.txt").read_text() == "host data"
    assert read_marker(world.raw) == MARKER
    check = node.tmp_path / "check"
    check.mkdir(exist_ok=True)
    subprocess.run(["mount", "-o", "ro", world.fsdev, str(check)], check=True)
    try:
        assert (check / "on-device.txt").read_text() == "fs data"
    finally:
        subprocess.run(["umount", str(check)], check=True)


async def test_local_and_host_path_volumes_survive_a_lost_log_and_go_when_no_pod_wants_them(
    node: Node,
) -> None:
    world = await arrange(node)
    host, raw, fsdev = world.host, world.raw, world.fsdev
    dir_bind, fs_bind, link = world.dir_bind, world.fs_bind, world.link
    global_map = world.global_map

    # Act: start on an empty log, desired state not complete
    second = await node.start(GATED, host=True)

    # Assert: every volume found through its plugin, Uncertain, reconstructed; no orphan
    report = second.reconstruction
    assert report is not None and not report.orphans
    found = {name: second.asw.podvols[(UID, name)] for name in ("pv-dir", "pv-fs", "pv-raw", "hp")}
    for name, pv in found.items():
        assert (pv.state, pv.reconstructed) == ("Uncertain", True), name
        assert pv.reason.startswith(f"{REASON_FOUND}: {node.root}/pods/{UID}/"), pv.reason
    assert found["pv-fs"].reason.endswith(f"(local PV on block device {fsdev})")
    assert found["hp"].reason.endswith(f"(hostPath {host / 'hp'}, recorded in {RECORD})")
    raw_device = second.asw.devices["kubernetes.io/local-volume/pv-raw"]
    assert (raw_device.state, raw_device.device_mount_path) == ("Uncertain", str(global_map))
    assert report.reconstructed == 5  # four pod volumes and the Block PV's global map dir

    # Assert: nothing is unmounted or removed before the desired state is complete
    passes = second.reconciler.passes
    await eventually(lambda: second.reconciler.passes > passes + 10, "reconcile passes")
    assert mounts.find_mount(dir_bind) is not None and mounts.find_mount(fs_bind) is not None
    assert os.readlink(link) == raw and mounts.find_mount(global_map / UID) is not None

    # Act: the whole desired state is the PVs, no pod
    await second.apply(world.objects, complete=True)

    # Assert: binds, links, map files and records gone; the pod dir with them
    await second.wait_pod(UID, "unmounted", timeout=60)
    await eventually(lambda: not node.layout.pod_dir(UID).exists(), "the pod dir removed", 30)
    await eventually(lambda: not global_map.exists(), "the global map dir removed", 30)
    assert not mounts.mounts_under(node.root) and not loop_devices_for(global_map / UID)
    log = node.log
    assert log is not None
    unmounted = {
        e.body.volume_name: e.body.reason
        for e in log.read_after(0)
        if isinstance(e.body, VolumeUnmounted)
    }
    assert unmounted == {
        "pv-dir": "unpublished",
        "pv-fs": "unpublished",
        "pv-raw": "unmapped",
        "hp": "unpublished",
    }
    # ...and nothing on the devices or host paths is lost
    assert_data_intact(node, world)


async def test_local_and_host_path_volumes_found_after_a_lost_log_are_kept_for_their_pod(
    node: Node,
) -> None:
    # Arrange
    world = await arrange(node)
    second = await node.start(GATED, host=True)
    bind_ids = {p: mounts.find_mount(p) for p in (world.dir_bind, world.fs_bind)}

    # Act: the pod is applied again, with its volume names, as the whole desired state
    await second.apply([*world.objects, world.pod], complete=True)

    # Assert: each found entry is handed over to the pod's name and Mounted again on the
    # same binds, link and data; the entries under the dir names are Unmounted
    await second.wait_pod(UID, "mounted", timeout=60)
    for found, name in (("pv-dir", "dir"), ("pv-fs", "fs"), ("pv-raw", "raw")):
        assert second.asw.podvols[(UID, name)].state == "Mounted"
        assert "handed over" in second.asw.podvols[(UID, found)].reason
    assert second.asw.podvols[(UID, "hp")].state == "Mounted"
    for path, before in bind_ids.items():
        assert before is not None and len(mounts_at(path)) == 1
        assert mounts.find_mount(path) == before
    assert os.readlink(world.link) == world.raw
    assert len(mounts_at(world.global_map / UID)) == 1
    assert len(loop_devices_for(world.global_map / UID)) == 1
    assert (world.dir_bind / "kept.txt").read_text() == "local dir data"
    assert (world.fs_bind / "on-device.txt").read_text() == "fs data"
    with world.link.open("rb") as dev:
        dev.seek(MIB)
        assert dev.read(len(MARKER)) == MARKER
