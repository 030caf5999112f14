"""Filesystem volumes through the plugin and the real driver, with the kubelet's layout."""

from __future__ import annotations

import os
import stat
from dataclasses import replace

from tests.csiplugin.conftest import DRIVER, NODE, MakePlugin, StartDriver
from tests.csiplugin.helpers import (
    csi_driver_object,
    leftovers,
    new_volume,
    read_json,
    request,
    sha,
)
from tests.csiplugin.hostile import HostileDriver
from tests.helpers.csidriver import DriverProcess, leftovers_under, loops_of, mounts_at
from volfsm.node.layout import RootLayout
from volfsm.plugins.csi.paths import attachment_id
from volfsm.plugins.csi.plugin import CsiPlugin


async def test_full_lifecycle_uses_the_kubelet_layout(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    handle = new_volume(driver, "vol-life")
    dev_req = request(plugin, handle, spec_name="pv-life")
    pod_req = request(plugin, handle, spec_name="pv-life", pod_uid="pod-a", volume_name="data")
    root = layout.root
    staging = root / f"plugins/kubernetes.io/csi/{DRIVER}/{sha(handle)}/globalmount"
    target = root / "pods/pod-a/volumes/kubernetes.io~csi/pv-life/mount"
    assert dev_req.device_mount_path == staging
    assert pod_req.mount_path == target

    staged = await plugin.mount_device(dev_req)
    assert staged.mount_found is True
    assert staged.path == str(staging)
    assert "ext4 /dev/loop" in staged.detail
    assert [m.fstype for m in mounts_at(staging)] == ["ext4"]
    assert read_json(staging.parent / "vol_data.json") == {
        "volumeHandle": handle,
        "driverName": DRIVER,
    }
    assert stat.S_IMODE(os.stat(staging.parent).st_mode) == 0o750

    published = await plugin.set_up(pod_req)
    assert published.mount_found is True, published.detail
    assert published.detail.startswith("ext4 /dev/loop"), published.detail
    assert "not the staged" not in published.detail
    assert read_json(target.parent / "vol_data.json") == {
        "specVolID": "pv-life",
        "volumeHandle": handle,
        "driverName": DRIVER,
        "nodeName": NODE,
        "attachmentID": attachment_id(handle, DRIVER, NODE),
        "volumeLifecycleMode": "Persistent",
    }
    (target / "hello").write_text("kept on the volume")
    assert (staging / "hello").read_text() == "kept on the volume"

    await plugin.tear_down(pod_req)
    assert not target.parent.exists()
    assert staging.is_dir()
    await plugin.unmount_device(dev_req)
    assert not staging.parent.exists()
    assert leftovers(layout) == []
    assert loops_of(driver.image(handle)) == []
    assert leftovers_under(layout.root).empty

    # The data survived: stage and publish again for another pod.
    await plugin.mount_device(dev_req)
    again = request(plugin, handle, spec_name="pv-life", pod_uid="pod-b")
    await plugin.set_up(again)
    assert (again.mount_path / "hello").read_text() == "kept on the volume"  # type: ignore[operator]
    await plugin.tear_down(again)
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_publish_dir_falls_back_to_the_pod_volume_name(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    """Without spec_name (an inline volume's spec name is the pod volume name)."""
    handle = new_volume(driver, "vol-noname")
    req = request(plugin, handle, pod_uid="pod-a", volume_name="cache")
    req_no_spec = replace(req, spec_name="")
    path = plugin.pod_mount_path(layout.root, req_no_spec)
    assert path == layout.root / "pods/pod-a/volumes/kubernetes.io~csi/cache/mount"


async def test_two_pods_share_one_stage(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    handle = new_volume(driver, "vol-shared")
    dev_req = request(plugin, handle)
    pod_a = request(plugin, handle, pod_uid="pod-a")
    pod_b = request(plugin, handle, pod_uid="pod-b")
    await plugin.mount_device(dev_req)
    assert (await plugin.set_up(pod_a)).mount_found is True
    assert (await plugin.set_up(pod_b)).mount_found is True
    (pod_a.mount_path / "from-a").write_text("a")  # type: ignore[operator]
    assert (pod_b.mount_path / "from-a").read_text() == "a"  # type: ignore[operator]

    await plugin.tear_down(pod_a)
    assert mounts_at(dev_req.device_mount_path)  # type: ignore[arg-type]
    assert mounts_at(pod_b.mount_path)  # type: ignore[arg-type]
    assert not (layout.root / "pods/pod-a/volumes/kubernetes.io~csi" / pod_a.spec_name).exists()

    await plugin.tear_down(pod_b)
    await plugin.unmount_device(dev_req)
    assert driver.log_text().count("NodeStageVolume request") == 1
    assert leftovers(layout) == []


async def test_without_stage_capability_dirs_and_json_are_still_made_and_removed(
    start_driver: StartDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    drv = start_driver("--no-stage")
    plugin = await make_plugin(drv.endpoint)
    assert plugin.caps.stage_unstage is False
    assert plugin.is_device_mountable(request(plugin, "x").source)
    handle = new_volume(drv, "vol-nostage")
    dev_req = request(plugin, handle)
    pod_req = request(plugin, handle, pod_uid="pod-a")
    staging = dev_req.device_mount_path
    assert staging is not None

    result = await plugin.mount_device(dev_req)
    assert result.mount_found is None
    assert "no STAGE_UNSTAGE_VOLUME" in result.detail
    assert staging.is_dir() and not mounts_at(staging)
    assert read_json(staging.parent / "vol_data.json")["volumeHandle"] == handle

    published = await plugin.set_up(pod_req)
    assert published.mount_found is True
    publish = drv.log_text().split("NodePublishVolume request", 1)[1].splitlines()[0]
    assert "staging_target_path" not in publish

    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)
    assert "NodeStageVolume" not in drv.log_text()
    assert "NodeUnstageVolume" not in drv.log_text()
    assert leftovers(layout) == []


async def test_read_only_publish_is_mounted_read_only(
    driver: DriverProcess, plugin: CsiPlugin
) -> None:
    handle = new_volume(driver, "vol-ro")
    dev_req = request(plugin, handle)
    pod_req = request(plugin, handle, pod_uid="pod-a", read_only=True)
    await plugin.mount_device(dev_req)
    result = await plugin.set_up(pod_req)
    assert result.mount_found is True
    assert "read-only was requested" not in result.detail
    assert "ro" in mounts_at(pod_req.mount_path)[-1].options  # type: ignore[arg-type]
    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)


async def test_stats_through_the_publish_path(driver: DriverProcess, plugin: CsiPlugin) -> None:
    handle = new_volume(driver, "vol-stats")
    dev_req = request(plugin, handle)
    pod_req = request(plugin, handle, pod_uid="pod-a")
    await plugin.mount_device(dev_req)
    await plugin.set_up(pod_req)
    (pod_req.mount_path / "blob").write_bytes(b"x" * (2 << 20))  # type: ignore[operator]
    os.sync()
    stats = await plugin.volume_stats(pod_req)
    assert stats["bytes_total"] > 20 << 20
    assert stats["bytes_used"] >= 2 << 20
    assert stats["inodes_total"] > 0
    stats_call = driver.log_text().split("NodeGetVolumeStats request", 1)[1].splitlines()[0]
    assert str(pod_req.mount_path) in stats_call
    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)


async def test_inline_ephemeral_volume_is_published_without_staging(
    hostile: HostileDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    plugin = await make_plugin(hostile.endpoint)
    csi_driver_object(plugin, volume_lifecycle_modes=("Persistent", "Ephemeral"))
    handle = "csi-" + sha("pod-a" + "scratch")
    dev_req = request(plugin, handle, spec_name="scratch", ephemeral=True)
    pod_req = request(
        plugin, handle, spec_name="scratch", pod_uid="pod-a", volume_name="scratch", ephemeral=True
    )
    assert dev_req.device_mount_path is None
    assert (await plugin.mount_device(dev_req)).detail == "inline ephemeral volume: not staged"
    await plugin.set_up(pod_req)
    assert pod_req.mount_path is not None
    assert read_json(pod_req.mount_path.parent / "vol_data.json")["volumeLifecycleMode"] == (
        "Ephemeral"
    )
    sent = hostile.requests("NodePublishVolume")[0]
    assert sent.staging_target_path == ""
    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)
    assert hostile.requests("NodeStageVolume") == []
    assert hostile.requests("NodeUnstageVolume") == []
    assert leftovers(layout) == []
