"""An orphan an operation is still working in is kept, not cleaned under it.

A pod deleted while its remount is in NodeStage leaves the staging dir no
desired pod wants; the crash matrix once saw the orphan cleanup remove it
while the driver was staging there. The operation owns the path until it
ends; what it leaves is torn down then.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from events.types import DesiredVolume, VolumeSource
from volfsm.engine.pending import NestedPendingOperations
from volfsm.engine.reconstruct.orphans import Orphan, OrphanCleaner

STAGING = Path("/r/plugins/kubernetes.io/csi/d/abc")


def _cleaner(pending: NestedPendingOperations, spec: DesiredVolume) -> OrphanCleaner:
    def request_paths(dv: DesiredVolume, pod_uid: str = "") -> tuple[Path, Path]:
        return STAGING / "globalmount", Path("/r/pods") / pod_uid

    ops: Any = SimpleNamespace(
        executor=SimpleNamespace(pending=pending), request_paths=request_paths
    )
    registry: Any = SimpleNamespace(volume_spec=lambda vid: spec if vid == spec.volume_id else None)
    dsw: Any = SimpleNamespace(pods={}, volumes_to_mount=list)
    return OrphanCleaner(
        handler=SimpleNamespace(),  # type: ignore[arg-type]
        dsw=dsw,
        ops=ops,
        layout=SimpleNamespace(),  # type: ignore[arg-type]
        registry=registry,
        entries_of=lambda uid, dv: set(),
    )


def test_a_staging_dir_is_kept_while_an_operation_runs_there() -> None:
    spec = DesiredVolume(
        name="data", volume_id="kubernetes.io/csi/d^h", source=VolumeSource(plugin="csi")
    )
    pending = NestedPendingOperations()
    cleaner = _cleaner(pending, spec)
    orphan = Orphan(path=str(STAGING), why="no vol_data.json", stream="device/orphan:x")
    assert cleaner.wanted(orphan) == ""  # nothing runs: it may go
    key = pending.start(spec.volume_id, "", "mount_device")
    assert "an operation on kubernetes.io/csi/d^h is running there" in cleaner.wanted(orphan)
    other = Orphan(path="/r/plugins/kubernetes.io/csi/d/other", why="x", stream="device/o:y")
    assert cleaner.wanted(other) == ""  # another dir is not in use
    pending.complete(key)
    assert cleaner.wanted(orphan) == ""


def test_a_pod_dir_orphan_is_kept_while_an_operation_on_that_pod_runs() -> None:
    spec = DesiredVolume(name="v", volume_id="vid", source=VolumeSource(plugin="csi"))
    pending = NestedPendingOperations()
    cleaner = _cleaner(pending, spec)
    orphan = Orphan(path="/r/pods/u1/volumes/x/y", why="?", stream="podvol/u1/y", pod_uid="u1")
    pending.start("vid", "u1", "volume_mount")
    assert "an operation on its pod is running" in cleaner.wanted(orphan)
