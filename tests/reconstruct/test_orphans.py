"""What cannot be reconstructed is listed, cleaned up once when no pod wants it, and a failed
cleanup is recorded with its reason (no eternal "orphaned pod" without one)."""

from __future__ import annotations

from pathlib import Path

from events.types import OperationFailed, OperationStarted, OperationSucceeded
from tests.engine.helpers import eventually
from tests.engine.objects import claim_volume, empty_dir_volume, pod, pv_set
from volfsm.cli.ops import recovery_lines
from volfsm.engine.reconstruct import ORPHAN_CLEANUP
from volfsm.node import mounts
from volfsm.plugins.scripted import ScriptedPlugin

from .conftest import GATED, Node


def junk(node: Node) -> dict[str, Path]:
    """Things a node can hold that no plugin can rebuild (made before the engine starts)."""
    root = node.root
    paths = {
        "unknown plugin": root / "pods/o1/volumes/kubernetes.io~foo/bar",
        "csi without json": root / "pods/o1/volumes/kubernetes.io~csi/pv-x",
        "mounted unknown": root / "pods/o2/volumes/kubernetes.io~nfs/share",
        "staging without json": root / "plugins/kubernetes.io/csi/drv.example/abc123",
    }
    for path in paths.values():
        path.mkdir(parents=True)
    (paths["unknown plugin"] / "data.bin").write_bytes(b"x" * 10)
    (paths["csi without json"] / "mount").mkdir()
    (paths["staging without json"] / "globalmount").mkdir()
    mounts.mount_tmpfs(paths["mounted unknown"], 1 << 20)
    return paths


def orphan_records(node: Node, stream: str) -> list[object]:
    assert node.log is not None
    return [
        env.body
        for env in node.log.read_stream(stream)
        if getattr(env.body, "operation", "") == ORPHAN_CLEANUP
    ]


async def test_orphans_are_listed_kept_until_complete_then_cleaned_once(node: Node) -> None:
    paths = junk(node)
    engine = await node.start(GATED)

    # Listed with why, nothing touched yet
    report = engine.reconstruction
    assert report is not None and report.uncertain == []
    why = {o.path: o.why for o in report.orphans}
    assert why == {
        str(paths["unknown plugin"]): "unknown volume plugin 'kubernetes.io/foo'",
        str(paths["csi without json"]): f"{paths['csi without json']}/vol_data.json is missing",
        str(paths["mounted unknown"]): "unknown volume plugin 'kubernetes.io/nfs'",
        str(paths["staging without json"]): (
            f"{paths['staging without json']}/vol_data.json is missing"
        ),
    }
    passes = engine.reconciler.passes
    await eventually(lambda: engine.reconciler.passes > passes + 10, "passes")
    assert all(path.exists() for path in paths.values())
    assert mounts.find_mount(paths["mounted unknown"]) is not None
    assert {o.status for o in report.orphans} == {"pending"}

    # Complete: cleaned once, each recorded as an orphan_cleanup operation; the file in
    # the unknown plugin's dir is not volfsm's: it stays, and so do its dir and pod dir
    engine.set_desired_complete("told by the test")
    unknown = str(paths["unknown plugin"])
    await eventually(lambda: all(o.status != "pending" for o in report.orphans), "cleaned")
    assert {o.path: o.status for o in report.orphans} == {
        str(path): "kept" if str(path) == unknown else "cleaned" for path in paths.values()
    }
    assert (paths["unknown plugin"] / "data.bin").read_bytes() == b"x" * 10
    assert not any(path.exists() for name, path in paths.items() if name != "unknown plugin")
    assert not mounts.mounts_under(node.root)
    await eventually(lambda: not (node.root / "pods/o2").exists(), "o2's pod dir removed")
    await eventually(lambda: "o1" in engine.recovery_status()["pod_dir_failures"], "o1 stays")
    assert engine.recovery_status()["pod_dir_failures"]["o1"] == (
        f"kept: {unknown}/data.bin: a file volfsm did not create"
    )
    assert not (node.root / "plugins/kubernetes.io/csi/drv.example").exists()
    bodies = orphan_records(node, "podvol/o1/bar")
    assert [type(b) for b in bodies] == [OperationStarted, OperationFailed]
    kept = bodies[1]
    assert isinstance(kept, OperationFailed)
    assert (kept.code, kept.final) == ("KeptFiles", True)
    assert kept.message == f"{unknown} stays: kept: {unknown}/data.bin: a file, not volfsm's"
    started = bodies[0]
    assert isinstance(started, OperationStarted)
    assert started.reason == (
        "could not be reconstructed (unknown volume plugin 'kubernetes.io/foo');"
        " no desired pod wants it"
    )
    stream = "device/orphan:plugins/kubernetes.io/csi/drv.example/abc123"
    assert [type(b) for b in orphan_records(node, stream)] == [
        OperationStarted,
        OperationSucceeded,
    ]
    assert not [v for v in engine.volumes() if v.volume_id.startswith("orphan:")]


async def test_a_failed_orphan_cleanup_is_recorded_with_its_reason(node: Node) -> None:
    # Arrange: two orphans (a pod dir's, a plugin dir's) holding an empty dir that cannot go
    # (its parent is immutable)
    stuck = node.root / "pods/o1/volumes/kubernetes.io~foo/bar"
    staging = node.root / "plugins/kubernetes.io/csi/drv.example/abc"
    for where in (stuck, staging):
        (where / "locked").mkdir(parents=True)
        node.make_immutable(where)
    locked = stuck / "locked"

    # Act
    engine = await node.start()  # the desired state is complete at once

    # Assert: tried once, failed, recorded (final) with the reason; listed for `volfsm get`
    report = engine.reconstruction
    assert report is not None
    orphan, global_orphan = sorted(report.orphans, key=lambda o: o.pod_uid, reverse=True)
    await eventually(lambda: orphan.status == global_orphan.status == "failed", "both failed")
    assert "Operation not permitted" in orphan.error
    bodies = orphan_records(node, "podvol/o1/bar")
    assert [type(b) for b in bodies] == [OperationStarted, OperationFailed]
    failed = bodies[1]
    assert isinstance(failed, OperationFailed)
    assert (failed.code, failed.final) == ("EPERM", True)
    assert failed.message == f"{stuck} stays: {locked}: Operation not permitted"
    status = engine.recovery_status()
    await eventually(lambda: "o1" in engine.recovery_status()["pod_dir_failures"], "pod dir")
    status = engine.recovery_status()
    assert status["pod_dir_failures"]["o1"] == (
        f"kept: {locked}: cannot be removed: Operation not permitted"
    )
    lines = recovery_lines(status)
    assert lines[0] == (
        f"orphan {stuck}: unknown volume plugin 'kubernetes.io/foo'; cleanup failed:"
        f" {locked}: Operation not permitted"
    )
    assert lines[1] == f"  kept: {locked}: cannot be removed: Operation not permitted"
    assert lines[2].startswith(f"orphan {staging}: {staging}/vol_data.json is missing; cleanup")
    assert lines[4].startswith("pod dir o1 stays: ")
    assert locked.is_dir() and (staging / "locked").is_dir()
    [shown] = [v for v in engine.volumes() if v.volume_id.startswith("orphan:")]
    assert shown.volume_id == "orphan:plugins/kubernetes.io/csi/drv.example/abc"
    assert shown.last_error is not None and shown.last_error.code == "EPERM"
    # Once: later passes do not try again
    passes = engine.reconciler.passes
    await eventually(lambda: engine.reconciler.passes > passes + 10, "passes")
    assert len(orphan_records(node, "podvol/o1/bar")) == 2


async def test_an_orphan_a_desired_pod_wants_is_left_for_its_mount(
    node: Node, scripted: ScriptedPlugin
) -> None:
    # Arrange: the PV's pod dir is on the node without its vol_data.json
    entry = node.root / "pods/p1/volumes/kubernetes.io~csi/v1"
    entry.mkdir(parents=True)
    engine = await node.start(GATED, scripted=scripted)
    [orphan] = engine.reconstruction.orphans if engine.reconstruction else []

    # Act: the pod wanting it is applied, then the desired state is complete
    await engine.apply([*pv_set("v1"), pod("p1", claim_volume("data", "v1"))], complete=True)

    # Assert: kept, with why
    await eventually(lambda: orphan.status == "kept", "kept")
    assert orphan.error == "a desired pod wants it: its mount may rebuild it"
    assert entry.is_dir()
    await engine.wait_pod("p1", "mounted", timeout=30)


async def test_a_leftover_dir_of_a_desired_pod_is_kept_while_its_mounts_run(node: Node) -> None:
    # Arrange: an empty plugin dir in the pod dir of a pod that is desired again
    leftover = node.root / "pods/p1/volumes/kubernetes.io~empty-dir"
    leftover.mkdir(parents=True)
    engine = await node.start(GATED)
    [orphan] = engine.reconstruction.orphans if engine.reconstruction else []
    assert orphan.path == str(leftover)

    # Act: the pod is applied, then the desired state is complete
    await engine.apply([pod("p1", empty_dir_volume("scratch"))], complete=True)

    # Assert: not removed under the pod's mount; kept with why; the pod mounts
    await eventually(lambda: orphan.status == "kept", "kept")
    assert orphan.error == "its pod is desired: the pod's own cleanup removes it when the pod goes"
    await engine.wait_pod("p1", "mounted", timeout=30)
    assert (leftover / "scratch").is_dir()
    assert not orphan_records(node, orphan.stream)
