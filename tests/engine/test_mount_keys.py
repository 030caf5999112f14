"""Which mounts of one volume may run for several pods at once (the kubelet's operation keys)."""

from __future__ import annotations

from pathlib import Path

from events.types import DesiredVolume, VolumeSource
from volfsm.desired.resolve import PLUGIN_LOCAL
from volfsm.engine.operations import EMPTY_POD, mount_key_pod
from volfsm.node.layout import RootLayout
from volfsm.plugins.emptydir import EMPTY_DIR_PLUGIN, EmptyDirPlugin
from volfsm.plugins.local import LocalVolumePlugin


def test_a_local_volume_mounts_for_one_pod_at_a_time(tmp_path: Path) -> None:
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
    assert mount_key_pod(EmptyDirPlugin(layout), scratch, "u1") == "u1"
