"""Block volumes: kubelet's staging/publish/global map paths, and the engine's mapping on top."""

from __future__ import annotations

import os
import stat
from dataclasses import replace

import pytest

from tests.csiplugin.conftest import DRIVER, NODE, MakePlugin, StartDriver
from tests.csiplugin.helpers import block_request, leftovers, new_volume, read_json
from tests.helpers.csidriver import (
    DriverProcess,
    leftovers_under,
    loop_devices,
    loops_of,
    mounts_at,
)
from volfsm.node import blockmap
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import ErrorClass, PluginError
from volfsm.plugins.csi.paths import attachment_id
from volfsm.plugins.csi.plugin import CsiPlugin

CSI = "plugins/kubernetes.io/csi/volumeDevices"


async def test_block_lifecycle_with_the_engines_mapping(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    handle = new_volume(driver, "vol-blk", block=True)
    dev_req = block_request(plugin, handle, spec_name="pv-blk")
    pod_req = block_request(plugin, handle, spec_name="pv-blk", pod_uid="pod-a")
    root = layout.root
    assert dev_req.device_mount_path == root / CSI / "pv-blk/dev"
    assert pod_req.device_mount_path == root / CSI / "pv-blk/dev"
    assert pod_req.mount_path == root / "pods/pod-a/volumeDevices/kubernetes.io~csi/pv-blk"

    staged = await plugin.mount_device(dev_req)
    assert staged.path == str(root / CSI / "staging/pv-blk")
    assert (root / CSI / "staging/pv-blk").is_dir()
    assert staged.mount_found is None
    assert read_json(root / CSI / "pv-blk/data/vol_data.json") == {
        "specVolID": "pv-blk",
        "volumeHandle": handle,
        "driverName": DRIVER,
        "nodeName": NODE,
        "attachmentID": attachment_id(handle, DRIVER, NODE),
    }
    loops = loops_of(driver.image(handle))
    assert len(loops) == 1

    published = await plugin.set_up(pod_req)
    device_file = root / CSI / "publish/pv-blk/pod-a"
    assert published.device_path == str(device_file)
    assert published.mount_found is True, published.detail
    assert "devtmpfs" in published.detail
    assert stat.S_ISBLK(os.stat(device_file).st_mode)
    assert os.stat(device_file).st_rdev == os.stat(loops[0]).st_rdev

    # What the engine does next (kubelet MapBlockVolume), with the plugin's paths.
    assert pod_req.device_mount_path is not None and pod_req.mount_path is not None
    mapped = await blockmap.map_block_volume_async(
        layout,
        published.device_path,
        pod_req.device_mount_path,
        "pod-a",
        pod_req.mount_path.parent,
        pod_req.mount_path.name,
    )
    assert os.readlink(pod_req.mount_path) == str(device_file)
    with open(pod_req.mount_path, "r+b") as dev:
        dev.write(b"block data")
    await blockmap.unmap_block_volume_async(
        layout, pod_req.device_mount_path, "pod-a", pod_req.mount_path.parent, "pv-blk"
    )
    assert mapped.loop_device not in [dev for dev, _ in loop_devices()]

    await plugin.tear_down(pod_req)
    assert not device_file.exists()
    await plugin.unmount_device(dev_req)
    assert not (root / CSI / "pv-blk").exists()
    assert not (root / CSI / "staging/pv-blk").exists()
    assert not (root / CSI / "publish/pv-blk").exists()
    assert dev_req.device_mount_path is not None
    assert await blockmap.remove_global_map_dir_async(layout, dev_req.device_mount_path) is False
    assert leftovers(layout) == []
    assert loops_of(driver.image(handle)) == []
    assert leftovers_under(root).empty
    with open(driver.image(handle), "rb") as img:
        assert img.read(10) == b"block data"


async def test_two_pods_map_one_block_volume(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    handle = new_volume(driver, "vol-blk2", block=True)
    dev_req = block_request(plugin, handle)
    pods = [block_request(plugin, handle, pod_uid=uid) for uid in ("pod-a", "pod-b")]
    await plugin.mount_device(dev_req)
    files = [(await plugin.set_up(req)).device_path for req in pods]
    assert len(set(files)) == 2
    await plugin.tear_down(pods[0])
    assert not os.path.exists(files[0])
    assert stat.S_ISBLK(os.stat(files[1]).st_mode)
    await plugin.tear_down(pods[1])
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_block_without_stage_capability(
    start_driver: StartDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    drv = start_driver("--no-stage")
    plugin = await make_plugin(drv.endpoint)
    handle = new_volume(drv, "vol-blk-ns", block=True)
    dev_req = block_request(plugin, handle)
    pod_req = block_request(plugin, handle, pod_uid="pod-a")
    result = await plugin.mount_device(dev_req)
    assert "no STAGE_UNSTAGE_VOLUME" in result.detail
    published = await plugin.set_up(pod_req)
    assert stat.S_ISBLK(os.stat(published.device_path).st_mode)
    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)
    assert "NodeStageVolume" not in drv.log_text()
    assert leftovers(layout) == []
    assert not mounts_at(published.device_path)


async def test_block_paths_need_the_spec_name(plugin: CsiPlugin, layout: RootLayout) -> None:
    req = block_request(plugin, "h", spec_name="pv-x")
    anonymous = replace(req, spec_name="")
    with pytest.raises(PluginError) as err:
        plugin.device_mount_path(layout.root, anonymous)
    assert err.value.code == "MissingSpecName"
    assert err.value.error_class is ErrorClass.TRANSIENT
    with pytest.raises(PluginError):
        await plugin.unmount_device(anonymous)


async def test_block_stage_final_error_removes_the_volume_dirs(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    handle = new_volume(driver, "vol-blk-err", block=True)
    dev_req = block_request(plugin, handle, spec_name="pv-err")
    driver.set_faults([{"rpc": "NodeStageVolume", "action": "error", "code": "NOT_FOUND"}])
    with pytest.raises(PluginError) as err:
        await plugin.mount_device(dev_req)
    assert err.value.final
    assert not (layout.root / CSI / "pv-err").exists()
    assert not (layout.root / CSI / "staging/pv-err").exists()
    driver.set_faults([{"rpc": "NodeStageVolume", "action": "error", "code": "UNAVAILABLE"}])
    with pytest.raises(PluginError) as err:
        await plugin.mount_device(dev_req)
    assert err.value.error_class is ErrorClass.UNCERTAIN
    assert (layout.root / CSI / "pv-err/data/vol_data.json").is_file()
    driver.clear_faults()
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []
