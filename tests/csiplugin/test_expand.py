"""NodeExpandVolume through the plugin: the new size is visible in the mounted filesystem."""

from __future__ import annotations

import pytest

from tests.csiplugin.conftest import MakePlugin, StartDriver
from tests.csiplugin.helpers import (
    MIB,
    block_request,
    leftovers,
    new_volume,
    request,
    statvfs_bytes,
)
from tests.helpers.csidriver import DriverProcess
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import ErrorClass, PluginError
from volfsm.plugins.csi.plugin import CsiPlugin


async def test_expanding_a_mounted_filesystem_volume(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    handle = new_volume(driver, "vol-grow", 32 * MIB)
    dev_req = request(plugin, handle)
    pod_req = request(plugin, handle, pod_uid="pod-a")
    target = pod_req.mount_path
    assert target is not None
    await plugin.mount_device(dev_req)
    await plugin.set_up(pod_req)
    (target / "before").write_text("still here")
    before = statvfs_bytes(target)
    assert before < 32 * MIB

    size = await plugin.expand(pod_req, 96 * MIB)
    assert size >= 96 * MIB
    after = statvfs_bytes(target)
    assert after > before + 48 * MIB, (before, after)
    assert (target / "before").read_text() == "still here"
    call = driver.log_text().split("NodeExpandVolume request", 1)[1].splitlines()[0]
    assert f"'volume_path': '{target}'" in call
    assert f"'staging_target_path': '{dev_req.device_mount_path}'" in call
    assert "'required_bytes': '100663296'" in call

    # Expanding to a size it already has is fine (the driver answers OK).
    assert await plugin.expand(pod_req, 64 * MIB) >= 96 * MIB
    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_expanding_a_block_volume_uses_its_publish_path(
    driver: DriverProcess, plugin: CsiPlugin
) -> None:
    handle = new_volume(driver, "vol-grow-blk", 16 * MIB, block=True)
    dev_req = block_request(plugin, handle)
    pod_req = block_request(plugin, handle, pod_uid="pod-a")
    await plugin.mount_device(dev_req)
    published = await plugin.set_up(pod_req)
    assert await plugin.expand(pod_req, 24 * MIB) >= 24 * MIB
    with open(published.device_path, "rb") as dev:
        assert dev.seek(0, 2) >= 24 * MIB
    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)


async def test_expand_error_classes(driver: DriverProcess, plugin: CsiPlugin) -> None:
    handle = new_volume(driver, "vol-grow-err")
    dev_req = request(plugin, handle)
    pod_req = request(plugin, handle, pod_uid="pod-a")
    await plugin.mount_device(dev_req)
    await plugin.set_up(pod_req)
    driver.set_faults([{"rpc": "NodeExpandVolume", "action": "error", "code": "OUT_OF_RANGE"}])
    with pytest.raises(PluginError) as err:
        await plugin.expand(pod_req, 40 * MIB)
    assert (err.value.code, err.value.error_class) == ("OutOfRange", ErrorClass.FINAL)
    driver.set_faults([{"rpc": "NodeExpandVolume", "action": "error", "code": "UNAVAILABLE"}])
    with pytest.raises(PluginError) as err:
        await plugin.expand(pod_req, 40 * MIB)
    assert err.value.error_class is ErrorClass.UNCERTAIN
    driver.clear_faults()
    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)


async def test_expand_without_the_capability_changes_nothing_on_the_node(
    start_driver: StartDriver, make_plugin: MakePlugin
) -> None:
    drv = start_driver()
    plugin = await make_plugin(drv.endpoint)
    plugin.caps = type(plugin.caps)(stage_unstage=True)  # as if EXPAND_VOLUME were absent
    assert not plugin.supports_expansion(request(plugin, "h").source)
    assert await plugin.expand(request(plugin, "h", pod_uid="pod-a"), 64 * MIB) == 64 * MIB
    assert "NodeExpandVolume" not in drv.log_text()
