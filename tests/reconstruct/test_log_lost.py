"""Log lost: the node still has its mounts and dirs, the new log knows nothing.

Every volume found is reconstructed Uncertain ("found on node, not in the
log"), nothing is unmounted until the desired state is complete, then what
is desired again is kept (same mount, same data) and the rest is cleaned.
"""

from __future__ import annotations

from events.streams import pod_stream
from tests.engine.helpers import eventually
from tests.engine.objects import empty_dir_volume, pod
from tests.helpers.csidriver import DriverProcess, create_volume, mounts_at
from volfsm.desired.resolve import csi_volume_id
from volfsm.engine.reconstruct import REASON_FOUND
from volfsm.node import mounts

from .conftest import CSI_DRIVER, GATED, Node

EMPTY = "kubernetes.io~empty-dir"
MIB = 1 << 20


def two_volume_pod(uid: str) -> dict[str, object]:
    return pod(uid, empty_dir_volume("mem", medium="Memory"), empty_dir_volume("disk"))


async def test_emptydir_mounts_found_on_the_node_are_kept_if_desired_and_cleaned_if_not(
    node: Node,
) -> None:
    # Arrange: two pods with a tmpfs and a plain emptyDir each, data written; the log goes
    first = await node.start()
    await first.apply([two_volume_pod("keep"), two_volume_pod("gone")])
    for uid in ("keep", "gone"):
        await first.wait_pod(uid, "mounted", timeout=30)
    mem = {uid: node.layout.pod_volume_dir(uid, EMPTY, "mem") for uid in ("keep", "gone")}
    disk = {uid: node.layout.pod_volume_dir(uid, EMPTY, "disk") for uid in ("keep", "gone")}
    (mem["keep"] / "data.txt").write_text("in memory")
    (disk["keep"] / "data.txt").write_text("on disk")
    await node.stop()
    node.lose_log()

    # Act: start on an empty log, desired state not complete
    second = await node.start(GATED)

    # Assert: every volume found is Uncertain, reconstructed, with its reason
    report = second.reconstruction
    assert report is not None
    assert report.reconstructed == 4 and len(report.uncertain) == 4 and not report.orphans
    for uid in ("keep", "gone"):
        for name in ("mem", "disk"):
            pv = second.asw.podvols[(uid, name)]
            assert (pv.state, pv.reconstructed) == ("Uncertain", True)
            assert pv.reason.startswith(f"{REASON_FOUND}: {node.root}/pods/{uid}/volumes/")
    assert f"(mounted: {mem['gone']})" in second.asw.podvols[("gone", "mem")].reason
    statuses = {p.uid: p for p in second.pods()}
    assert statuses["gone"].phase == "Terminating" and statuses["gone"].name == ""

    # Assert: nothing is unmounted or removed before the desired state is complete
    passes = second.reconciler.passes
    await eventually(lambda: second.reconciler.passes > passes + 10, "reconcile passes")
    assert mounts.find_mount(mem["gone"]) is not None and disk["gone"].is_dir()
    assert second.asw.podvols[("gone", "mem")].state == "Uncertain"

    # Act: the whole desired state is "keep" only
    result = await second.apply([two_volume_pod("keep")], complete=True)

    # Assert: keep is Mounted again on the same tmpfs with its data; gone is cleaned up
    assert result.deleted == ()  # the lost log's desired state had no pods to delete
    await second.wait_pod("keep", "mounted", timeout=30)
    await second.wait_pod("gone", "unmounted", timeout=30)
    assert (mem["keep"] / "data.txt").read_text() == "in memory"
    assert (disk["keep"] / "data.txt").read_text() == "on disk"
    [tmpfs] = [m for m in mounts.mounts_under(node.layout.pod_dir("keep"))]
    assert tmpfs.mount_point == str(mem["keep"]) and tmpfs.fstype == "tmpfs"
    await eventually(lambda: not node.layout.pod_dir("gone").exists(), "gone's pod dir removed")
    assert not mounts.mounts_under(node.layout.pods_dir / "gone")
    assert second.recovery_status()["desired_complete_reason"] == "told: apply --complete"
    # ...and forgotten, though only reconstruction knew it: PodCleanedUp, no entries left
    log = node.log
    assert log is not None
    stream = pod_stream("gone")
    await eventually(
        lambda: [e.type for e in log.read_stream(stream)] == ["PodCleanedUp"], "PodCleanedUp"
    )
    # (the live state folds it just after the log has it)
    await eventually(lambda: not [key for key in second.asw.podvols if key[0] == "gone"], "fold")


def csi_pod(uid: str, claim: str, volume: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{uid}", "namespace": "default", "uid": uid},
        "spec": {"volumes": [{"name": volume, "persistentVolumeClaim": {"claimName": claim}}]},
    }


def csi_pv(name: str, handle: str) -> list[dict[str, object]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "csi": {"driver": CSI_DRIVER, "volumeHandle": handle, "fsType": "ext4"},
                "capacity": {"storage": "32Mi"},
                "accessModes": ["ReadWriteOnce"],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"volumeName": name},
            "status": {"phase": "Bound"},
        },
    ]


async def test_csi_volumes_are_rebuilt_from_vol_data_json_and_handed_to_the_desired_pod(
    node: Node, driver: DriverProcess
) -> None:
    # Arrange: two PV volumes published for two pods (pod volume "data" on PVs "pv-a",
    # "pv-b"), a file written, then the log goes
    for handle in ("vol-a", "vol-b"):
        create_volume(driver.clients(), handle, 32 * MIB)
    first = await node.start(driver=driver)
    await first.apply([*csi_pv("pv-a", "vol-a"), *csi_pv("pv-b", "vol-b")])
    await first.apply([csi_pod("pa", "pv-a", "data"), csi_pod("pb", "pv-b", "data")])
    for uid in ("pa", "pb"):
        await first.wait_pod(uid, "mounted", timeout=120)
    target_a = node.layout.csi_publish_path("pa", "pv-a")
    (target_a / "hello.txt").write_text("kept across a lost log")
    await node.stop()
    node.lose_log()

    # Act: start again on an empty log
    second = await node.start(GATED, driver=driver)

    # Assert: pod volumes named by their dirs (the PV names), devices from the staging json
    vid_a, vid_b = csi_volume_id(CSI_DRIVER, "vol-a"), csi_volume_id(CSI_DRIVER, "vol-b")
    for uid, name, vid in (("pa", "pv-a", vid_a), ("pb", "pv-b", vid_b)):
        pv = second.asw.podvols[(uid, name)]
        assert (pv.state, pv.reconstructed, pv.volume_id) == ("Uncertain", True, vid)
        dev = second.asw.devices[vid]
        assert (dev.state, dev.reconstructed) == ("Uncertain", True)
        assert dev.device_mount_path == str(node.layout.csi_staging_path(CSI_DRIVER, vid[-5:]))
        assert dev.plugin == f"kubernetes.io/csi:{CSI_DRIVER}"
        assert dev.attachable  # no CSIDriver object: attach required, as when it was mounted
    assert second.reconstruction is not None and not second.reconstruction.orphans

    # Act: pa is desired again (its volume is called "data"), pb is not
    await second.apply([*csi_pv("pv-a", "vol-a"), csi_pod("pa", "pv-a", "data")], complete=True)

    # Assert: pa's entry is handed over to "data" and remounted; the data is still there
    await second.wait_pod("pa", "mounted", timeout=120)
    assert (target_a / "hello.txt").read_text() == "kept across a lost log"
    assert second.asw.podvols[("pa", "pv-a")].state == "Unmounted"
    assert "handed over" in second.asw.podvols[("pa", "pv-a")].reason
    assert len(mounts_at(target_a)) == 1

    # Assert: pb is unpublished and unstaged, its dirs gone
    await second.wait_pod("pb", "unmounted", timeout=120)
    await eventually(lambda: vid_b not in second.asw.devices, "pb's volume detached", 60)
    assert not mounts.mounts_under(node.layout.pod_dir("pb"))
    assert not mounts_at(node.layout.csi_staging_path(CSI_DRIVER, "vol-b"))
    await eventually(lambda: not node.layout.pod_dir("pb").exists(), "pb's pod dir removed")
    assert driver.codes("NodeUnpublishVolume", "vol-b") == ["OK"]
    assert driver.codes("NodeUnstageVolume", "vol-b") == ["OK"]
