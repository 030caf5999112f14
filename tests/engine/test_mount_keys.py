"""Which mounts of one volume may run for several pods at once (the kubelet's operation keys)."""

from __future__ import annotations

from pathlib import Path

from events.types import DesiredVolume, VolumeSource
from volfsm.desired.resolve import PLUGIN_LOCAL
from volfsm.engine.operations import EMPTY_POD, mount_key_pod, unmount_key_pod
from volfsm.node.layout import RootLayout
from volfsm.plugins.emptydir import EMPTY_DIR_PLUGIN, EmptyDirPlugin
from volfsm.plugins.local import LocalVolumePlugin


def test_a_local_volume_mounts_and_unmounts_for_one_pod_at_a_time(tmp_path: Path) -> None:
    """Pods of one local PV share its global mount or map dir: keyed per volume, as the
    kubelet keys its device-mountable local plugin; an emptyDir is keyed per pod."""
    layout = RootLayout(tmp_path)
    local = DesiredVolume(
        name="data",
        volume_id=f"{PLUGIN_LOCAL}/pv-a",
        pv_name="pv-a",
        source=VolumeSource(plugin=PLUGIN_LOCAL, path="/mnt/disks/a"),
    )
    scratch = DesiredVolume(
        name="scratch",
        volume_id=f"{EMPTY_DIR_PLUGIN}/u1-scratch",
        source=VolumeSource(plugin=EMPTY_DIR_PLUGIN),
    )
    plugin = LocalVolumePlugin(layout, {})
    assert [mount_key_pod(plugin, local, uid) for uid in ("u1", "u2")] == [EMPTY_POD, EMPTY_POD]
    # its teardowns too: a pod's teardown unmounts the PV's global mount once no pod binds it,
    # which must not run while another pod's mount is between the global mount and its bind
    assert [unmount_key_pod(plugin, local, uid) for uid in ("u1", "u2")] == [EMPTY_POD] * 2
    empty_dir = EmptyDirPlugin(layout)
    assert mount_key_pod(empty_dir, scratch, "u1") == "u1"
    assert unmount_key_pod(empty_dir, scratch, "u1") == "u1"
