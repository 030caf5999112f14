"""Cleanup never deletes a file the log does not say volfsm created: orphans, the dirs of
deleted pods and volumes found on the node lose their empty directories only; what stays
is reported."""

from __future__ import annotations

import json
import os
from pathlib import Path

from events.streams import pod_stream, podvol_stream
from events.types import OperationFailed, OperationStarted, PodCleanedUp
from tests.engine.helpers import eventually
from tests.engine.objects import empty_dir_volume, pod
from tests.helpers.csidriver import DriverProcess, create_volume, mounts_at
from tests.paths.nodekit import snapshot
from volfsm.cli.ops import recovery_lines
from volfsm.desired.resolve import csi_volume_id
from volfsm.engine.reconstruct import ORPHAN_CLEANUP, REASON_FOUND
from volfsm.node import mounts

from .conftest import CSI_DRIVER, GATED, Node
from .test_log_lost import csi_pod, csi_pv

EMPTY = "kubernetes.io~empty-dir"
MIB = 1 << 20


def files_under(top: Path) -> dict[str, bytes]:
    """Every regular file under `top` (relative path -> bytes), links not followed."""
    found = {}
    for dirpath, _, names in os.walk(top, followlinks=False):
        for name in names:
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink():
                found[os.fspath(path.relative_to(top))] = path.read_bytes()
    return found


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


async def test_an_orphan_pod_dir_keeps_every_file_and_the_bind_source(node: Node) -> None:
    # Arrange: a pod dir volfsm never recorded: files at several depths (the pod's own and
    # an unknown plugin's), empty dirs, and a dir bind-mounted there from outside the root
    pod_dir = node.root / "pods/o1"
    bar = pod_dir / "volumes/kubernetes.io~foo/bar"
    write(pod_dir / "etc-hosts", b"127.0.0.1 localhost\n")
    write(pod_dir / "containers/c1/0.log", b"container log\n")
    write(bar / "a.txt", b"unknown plugin data")
    write(bar / "d1/d2/d3/deep.bin", bytes(range(256)))
    (bar / "empty/e1/e2").mkdir(parents=True)
    (pod_dir / "plugins/x/y").mkdir(parents=True)
    (pod_dir / "volumes/kubernetes.io~foo/empty-vol").mkdir()
    bound = bar / "bound"
    bound.mkdir()
    pod_files = files_under(pod_dir)
    source = node.tmp_path / "bind-source"
    write(source / "src.txt", b"not under the root")
    (source / "sub").mkdir()
    source_before = snapshot(source)
    mounts.bind_mount(source, bound)

    # Act: the desired state is complete at once: the orphans are cleaned up
    engine = await node.start()
    report = engine.reconstruction
    assert report is not None
    await eventually(lambda: all(o.status != "pending" for o in report.orphans), "cleanup")
    failures = engine.reconciler.pod_dir_failures  # its cleanup runs again after the orphans'
    await eventually(lambda: failures.get("o1", "").endswith("(4 kept in all)"), "pod dir")

    # Assert: every file, byte for byte; the bind source whole; the bind mount gone
    assert files_under(pod_dir) == pod_files
    assert snapshot(source) == source_before
    assert mounts.find_mount(bound) is None and not bound.exists()
    for gone in (
        bar / "empty",
        pod_dir / "plugins",
        pod_dir / "volumes/kubernetes.io~foo/empty-vol",
    ):
        assert not gone.exists(), gone
    # ...what stayed is reported: the orphan's status, its record, `volfsm get`, the JSON
    statuses = {o.path: (o.status, o.stayed) for o in report.orphans}
    assert statuses == {
        str(bar): (
            "kept",
            [
                f"kept: {bar}/a.txt: a file, not volfsm's",
                f"kept: {bar}/d1/d2/d3/deep.bin: a file, not volfsm's",
            ],
        ),
        str(pod_dir / "volumes/kubernetes.io~foo/empty-vol"): ("cleaned", []),
    }
    assert node.log is not None
    records = [e.body for e in node.log.read_stream(podvol_stream("o1", "bar"))]
    assert [type(b) for b in records] == [OperationStarted, OperationFailed]
    failed = records[1]
    assert isinstance(failed, OperationFailed) and failed.operation == ORPHAN_CLEANUP
    assert (failed.code, failed.final) == ("KeptFiles", True)
    status = json.loads(json.dumps(engine.recovery_status()))
    [shown] = [o for o in status["reconstruction"]["orphans"] if o["path"] == str(bar)]
    assert (shown["status"], shown["stayed_count"]) == ("kept", 2)
    assert shown["error"] == "2 entries volfsm did not create"
    lines = recovery_lines(status)
    assert (
        f"orphan {bar}: unknown volume plugin 'kubernetes.io/foo'; cleanup kept:"
        " 2 entries volfsm did not create"
    ) in lines
    assert f"  kept: {bar}/a.txt: a file, not volfsm's" in lines
    why = status["pod_dir_failures"]["o1"]
    assert why.startswith("kept: ") and why.endswith("(4 kept in all)")
    assert "a file volfsm did not create" in why
    assert not any(type(e.body) is PodCleanedUp for e in node.log.read_stream(pod_stream("o1")))


async def test_emptydirs_found_on_the_node_keep_their_files(node: Node) -> None:
    # Arrange: a pod with a disk emptyDir and two tmpfs ones, files in two; the log goes
    first = await node.start()
    volumes = (
        empty_dir_volume("disk"),
        empty_dir_volume("mem", medium="Memory"),
        empty_dir_volume("void", medium="Memory"),
    )
    await first.apply([pod("p", *volumes)])
    await first.wait_pod("p", "mounted", timeout=30)
    disk, mem, void = (node.layout.pod_volume_dir("p", EMPTY, n) for n in ("disk", "mem", "void"))
    write(disk / "a.txt", b"on disk")
    write(disk / "sub/b.bin", b"\x00\x01")
    (disk / "empty/dirs").mkdir(parents=True)
    write(mem / "m.txt", b"in memory")
    (void / "only-dirs").mkdir()
    await node.stop()
    node.lose_log()

    # Act: started again, nothing desired; the gate opens
    engine = await node.start(GATED)
    assert {pv.reason.split(":")[0] for pv in engine.asw.podvols.values()} == {REASON_FOUND}
    engine.set_desired_complete("told by the test")
    await engine.wait_pod("p", "unmounted", timeout=30)
    await eventually(lambda: "p" in engine.recovery_status()["pod_dir_failures"], "pod dir")

    # Assert: every file there; the tmpfs with a file still mounted, the empty one gone
    assert files_under(disk) == {"a.txt": b"on disk", "sub/b.bin": b"\x00\x01"}
    assert not (disk / "empty").exists()
    assert mounts.find_mount(mem) is not None and (mem / "m.txt").read_bytes() == b"in memory"
    assert mounts.find_mount(void) is None and not void.exists()
    # ...reported: on the unmount itself, and by the pod dir that stays
    reasons = {name: engine.asw.podvols[("p", name)].reason for name in ("disk", "mem", "void")}
    assert f"kept: {disk}/a.txt: a file the log did not create" in reasons["disk"]
    assert reasons["mem"].startswith(f"unpublished; the tmpfs at {mem} stays mounted")
    assert reasons["void"] == "unpublished"
    assert "volumes are still mounted under it" in engine.recovery_status()["pod_dir_failures"]["p"]
    # ...once: no teardown is tried again
    passes = engine.reconciler.passes
    await eventually(lambda: engine.reconciler.passes > passes + 10, "passes")
    assert node.log is not None
    for name in ("disk", "mem", "void"):
        started = [
            e.body
            for e in node.log.read_stream(podvol_stream("p", name))
            if isinstance(e.body, OperationStarted)
        ]
        assert [b.operation for b in started] == ["volume_unmount"], name


async def test_a_found_csi_volume_is_unpublished_by_its_driver_and_leftover_files_kept(
    node: Node, driver: DriverProcess
) -> None:
    # Arrange: two PV volumes published; pb's mount dir holds a file under the mount, pc's
    # vol_data.json is lost; then the log goes
    for handle in ("vol-b", "vol-c"):
        create_volume(driver.clients(), handle, 32 * MIB)
    first = await node.start(driver=driver)
    await first.apply([*csi_pv("pv-b", "vol-b"), *csi_pv("pv-c", "vol-c")])
    await first.apply([csi_pod("pb", "pv-b", "data"), csi_pod("pc", "pv-c", "data")])
    for uid in ("pb", "pc"):
        await first.wait_pod(uid, "mounted", timeout=120)
    await node.stop()
    node.lose_log()
    target_b = node.layout.csi_publish_path("pb", "pv-b")
    peek = node.tmp_path / "peek"  # the publish dir without the mount on it
    peek.mkdir()
    mounts.bind_mount(target_b.parent, peek)
    write(peek / "mount/shadowed.txt", b"under the mount")
    mounts.umount(peek)
    node.layout.csi_vol_data_path("pc", "pv-c").unlink()

    # Act: start on the empty log; nothing desired; the gate opens
    engine = await node.start(GATED, driver=driver)
    report = engine.reconstruction
    assert report is not None and not report.orphans
    staging_c = node.layout.csi_staging_dir(CSI_DRIVER, "vol-c")
    assert f"driver and handle from {staging_c}/vol_data.json" in (
        engine.asw.podvols[("pc", "pv-c")].reason
    )
    engine.set_desired_complete("told by the test")
    for uid in ("pb", "pc"):
        await engine.wait_pod(uid, "unmounted", timeout=120)
    vids = [csi_volume_id(CSI_DRIVER, h) for h in ("vol-b", "vol-c")]
    await eventually(lambda: not any(v in engine.asw.devices for v in vids), "unstaged", 60)

    # Assert: the driver unpublished and unstaged both (no bare unmount)
    for handle in ("vol-b", "vol-c"):
        assert driver.codes("NodeUnpublishVolume", handle) == ["OK"]
        assert driver.codes("NodeUnstageVolume", handle) == ["OK"]
    assert not mounts_at(target_b) and not mounts.mounts_under(node.root)
    # ...pb's leftover file stays (its vol_data.json goes), reported once, not retried
    assert (target_b / "shadowed.txt").read_bytes() == b"under the mount"
    assert not node.layout.csi_vol_data_path("pb", "pv-b").exists()
    entry = engine.asw.podvols[("pb", "pv-b")]
    assert entry.last_operation is not None and entry.last_operation.status == "succeeded"
    reason = entry.reason
    assert reason.startswith(f"unpublished; {target_b} stays after NodeUnpublishVolume: kept:")
    await eventually(lambda: "pb" in engine.recovery_status()["pod_dir_failures"], "pb stays")
    assert (
        f"kept: {target_b}/shadowed.txt: a file volfsm did not create"
        == (engine.recovery_status()["pod_dir_failures"]["pb"])
    )
    await eventually(lambda: not node.layout.pod_dir("pc").exists(), "pc's pod dir removed")
    passes = engine.reconciler.passes
    await eventually(lambda: engine.reconciler.passes > passes + 10, "passes")
    assert driver.codes("NodeUnpublishVolume", "vol-b") == ["OK"]
