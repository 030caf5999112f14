"""A new volume plugin needs no engine change to be reconstructed.

The scripted plugin, registered under a plugin name the engine has never
heard of, writes its own record of each volume; after the log is lost its
reconstruction hooks read the records back: its volumes are found Uncertain
with their full spec (not orphans) and torn down by the plugin itself. The
same pod dir without the plugin registered is an orphan of an unknown plugin.
"""

from __future__ import annotations

from events.streams import pod_stream
from events.types import DesiredVolume, PodAdded, VolumeSource
from tests.engine.helpers import eventually
from volfsm.engine.reconstruct import REASON_FOUND
from volfsm.node.layout import volume_handle_dir_name
from volfsm.plugins.scripted import ScriptedPlugin

from .conftest import GATED, Node

PLUGIN = "example.com/scripted"
ESCAPED = "example.com~scripted"
UID = "u-new"
SPEC = DesiredVolume(
    name="data",
    volume_id=f"{PLUGIN}/vol-1",
    source=VolumeSource(plugin=PLUGIN, driver="d1", volume_handle="vol-1"),
    pv_name="pv-1",
)


def new_plugin() -> ScriptedPlugin:
    return ScriptedPlugin(plugin_name=PLUGIN, device_mountable=True)


async def test_a_plugin_of_a_new_name_reconstructs_its_volumes_from_its_own_files(
    node: Node,
) -> None:
    # Arrange: the plugin mounts a pod's volume (staged and published), then the log goes
    plugin = new_plugin()
    first = await node.start(scripted=plugin)
    pod = PodAdded(pod_uid=UID, namespace="default", name="p", volumes=(SPEC,))
    await first.handler.record_async(pod_stream(UID), [pod])
    await first.wait_pod(UID, "mounted", timeout=30)
    volume_dir = node.layout.pod_volume_dir(UID, ESCAPED, "data")
    global_dir = node.layout.plugin_dir(PLUGIN) / volume_handle_dir_name("vol-1")
    assert volume_dir.is_dir() and (global_dir / "globalmount").is_dir()
    await node.stop()
    node.lose_log()

    # Act: start without the plugin; then with it, on a plugin object that knows nothing
    unknown = await node.start(GATED)
    orphans = unknown.reconstruction.orphans if unknown.reconstruction else []
    await node.stop()
    again = new_plugin()
    second = await node.start(GATED, scripted=again)

    # Assert: without it, its pod volume dir is an unknown plugin's orphan (its global
    # dirs are its own: no other plugin lists them)
    assert [(o.path, o.why) for o in orphans] == [
        (str(volume_dir), f"unknown volume plugin {PLUGIN!r}")
    ]
    # Assert: with it, pod volume and device are found with the spec the plugin wrote
    report = second.reconstruction
    assert report is not None and not report.orphans and report.reconstructed == 2
    pv = second.asw.podvols[(UID, "data")]
    assert (pv.state, pv.reconstructed, pv.volume_id) == ("Uncertain", True, SPEC.volume_id)
    assert pv.reason == f"{REASON_FOUND}: {volume_dir}"
    assert second.asw.devices[SPEC.volume_id].state == "Uncertain"
    assert second.reconciler.reconstructed[(UID, "data")] == SPEC
    assert second.reconciler.reconstructed_devices[SPEC.volume_id].source == SPEC.source

    # Act: no pod wants it
    second.set_desired_complete()

    # Assert: the plugin tears down and unstages its own volume
    await second.wait_pod(UID, "unmounted", timeout=30)
    await eventually(lambda: again.calls("unmount_device") == 1, "unstaged by the plugin")
    assert again.calls("tear_down") == 1
    await eventually(lambda: not node.layout.pod_dir(UID).exists(), "pod dir removed")
    assert not global_dir.exists()
