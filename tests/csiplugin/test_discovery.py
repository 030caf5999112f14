"""Finding the driver, who it is, what it can do, and following it (access modes, mount group)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from loguru import logger

from tests.csiplugin.conftest import DRIVER, NODE, MakePlugin, StartDriver
from tests.csiplugin.helpers import leftovers, new_volume, request, source
from tests.helpers.csidriver import DriverProcess
from volfsm.csi.v1 import csi_pb2
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import ErrorClass, PluginError
from volfsm.plugins.csi.client import CsiClient, NodeCapabilities, wait_for_socket
from volfsm.plugins.csi.plugin import CsiPlugin
from volfsm.plugins.csi.requests import access_mode, volume_capability

Mode = csi_pb2.VolumeCapability.AccessMode.Mode


async def test_start_reads_identity_and_capabilities(
    driver: DriverProcess, make_plugin: MakePlugin
) -> None:
    plugin = await make_plugin(driver.endpoint)
    assert plugin.info is not None
    assert plugin.info.name == DRIVER
    assert plugin.info.node_id == NODE
    assert plugin.caps == NodeCapabilities(
        stage_unstage=True, get_volume_stats=True, expand=True, volume_condition=True
    )
    assert plugin.supports_expansion(source("h"))


async def test_capability_flags_follow_the_driver(
    start_driver: StartDriver, make_plugin: MakePlugin
) -> None:
    drv = start_driver("--no-stage", "--single-node-multi-writer", "--volume-mount-group")
    plugin = await make_plugin(drv.endpoint)
    assert plugin.caps.stage_unstage is False
    assert plugin.caps.single_node_multi_writer is True
    assert plugin.caps.volume_mount_group is True
    assert plugin.caps.expand is True


async def test_operations_start_a_plugin_that_was_not_started(
    driver: DriverProcess, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    plugin = await make_plugin(driver.endpoint, start=False)
    handle = new_volume(driver, "vol-lazy")
    dev_req = request(plugin, handle)
    result = await plugin.mount_device(dev_req)
    assert plugin.info is not None and result.mount_found is True
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_wait_for_socket_timeout_is_a_clear_transient_error(
    tmp_path: Path, make_plugin: MakePlugin
) -> None:
    missing = f"unix://{tmp_path}/nobody.sock"
    plugin = await make_plugin(missing, start=False, socket_wait_s=0.2)
    with pytest.raises(PluginError) as err:
        await plugin.start()
    assert err.value.error_class is ErrorClass.TRANSIENT
    assert err.value.code == "Unavailable"
    assert f"{tmp_path}/nobody.sock did not appear within 0.2s (does not exist)" in str(err.value)

    not_a_socket = tmp_path / "file.sock"
    not_a_socket.write_text("")
    with pytest.raises(PluginError) as err:
        await wait_for_socket(f"unix://{not_a_socket}", 0.1)
    assert "exists but is not a socket" in err.value.message

    with pytest.raises(PluginError) as err:
        await wait_for_socket("tcp://127.0.0.1:1", 0.1)
    assert err.value.code == "InvalidEndpoint"


async def test_a_socket_nobody_answers_on(tmp_path: Path, make_plugin: MakePlugin) -> None:
    """The socket exists but no driver listens: Unavailable from the call, TRANSIENT from start."""
    path = tmp_path / "dead.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))  # bound, never listening
    try:
        plugin = await make_plugin(f"unix://{path}", start=False, timeout_s=2.0)
        with pytest.raises(PluginError) as err:
            await plugin.start()
        assert err.value.code == "Unavailable"
        assert err.value.error_class is ErrorClass.TRANSIENT
        client = CsiClient(f"unix://{path}", timeout_s=2.0)
        with pytest.raises(PluginError) as err:
            await client.node_capabilities()
        assert err.value.error_class is ErrorClass.UNCERTAIN
        await client.close()
    finally:
        sock.close()
        os.unlink(path)


async def test_driver_calling_itself_another_name(
    start_driver: StartDriver, make_plugin: MakePlugin
) -> None:
    drv = start_driver(name="other.volfsm.dev")
    strict = await make_plugin(drv.endpoint, start=False)
    with pytest.raises(PluginError) as err:
        await strict.start()
    assert err.value.code == "DriverNameMismatch"
    assert err.value.error_class is ErrorClass.TRANSIENT
    assert "'other.volfsm.dev'" in err.value.message and f"'{DRIVER}'" in err.value.message
    assert strict.info is None

    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(str(m)), level="WARNING", format="{message}")
    try:
        lenient = await make_plugin(drv.endpoint, strict_name=False)
    finally:
        logger.remove(sink)
    assert lenient.info is not None and lenient.info.name == "other.volfsm.dev"
    assert lenient.driver == DRIVER
    assert any("calls itself 'other.volfsm.dev'" in line for line in seen)
    info = await lenient.client.driver_info()
    assert info.name == "other.volfsm.dev"


def test_registered_name_must_be_a_driver_name(layout: RootLayout) -> None:
    with pytest.raises(ValueError, match="not a DNS-like name"):
        CsiPlugin("../etc", "unix:///tmp/x.sock", layout)


# ------------------------------------------------------------------ access modes


def test_access_mode_mapping_is_the_kubelets() -> None:
    assert access_mode(("ReadWriteOnce",), False) == Mode.SINGLE_NODE_WRITER
    assert access_mode(("ReadWriteOnce",), True) == Mode.SINGLE_NODE_MULTI_WRITER
    assert access_mode(("ReadWriteOncePod",), False) == Mode.SINGLE_NODE_WRITER
    assert access_mode(("ReadWriteOncePod",), True) == Mode.SINGLE_NODE_SINGLE_WRITER
    assert access_mode(("ReadOnlyMany",), True) == Mode.MULTI_NODE_READER_ONLY
    assert access_mode(("ReadWriteMany",), False) == Mode.MULTI_NODE_MULTI_WRITER
    assert access_mode((), False) == Mode.SINGLE_NODE_WRITER
    assert access_mode(("Bogus", "ReadWriteMany"), False) == Mode.MULTI_NODE_MULTI_WRITER


async def _publish_twice(
    plugin: CsiPlugin, drv: DriverProcess, name: str, modes: tuple[str, ...]
) -> tuple[list[object], list[str]]:
    """Stage once, publish for two pods; (results or errors, the modes the driver was sent)."""
    handle = new_volume(drv, name)
    src = source(handle, access_modes=modes)
    dev_req = request(plugin, handle, src=src)
    pods = [request(plugin, handle, pod_uid=uid, src=src) for uid in ("pod-a", "pod-b")]
    await plugin.mount_device(dev_req)
    outcomes: list[object] = []
    for req in pods:
        try:
            outcomes.append(await plugin.set_up(req))
        except PluginError as exc:
            outcomes.append(exc)
    for req, outcome in zip(pods, outcomes, strict=True):
        if not isinstance(outcome, PluginError):
            await plugin.tear_down(req)
    await plugin.unmount_device(dev_req)
    sent = [
        line.split("'mode': '", 1)[1].split("'", 1)[0]
        for line in drv.log_text().splitlines()
        if "NodePublishVolume request" in line and handle in line
    ]
    return outcomes, sent


async def test_rwo_becomes_single_node_multi_writer_when_advertised(
    start_driver: StartDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    drv = start_driver("--single-node-multi-writer")
    plugin = await make_plugin(drv.endpoint)
    outcomes, sent = await _publish_twice(plugin, drv, "vol-snmw", ("ReadWriteOnce",))
    assert sent == ["SINGLE_NODE_MULTI_WRITER"] * 2
    assert not any(isinstance(o, PluginError) for o in outcomes)
    assert leftovers(layout) == []


async def test_rwop_becomes_single_node_single_writer_and_the_driver_holds_it(
    start_driver: StartDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    drv = start_driver("--single-node-multi-writer")
    plugin = await make_plugin(drv.endpoint)
    outcomes, sent = await _publish_twice(plugin, drv, "vol-snsw", ("ReadWriteOncePod",))
    assert sent == ["SINGLE_NODE_SINGLE_WRITER"] * 2
    second = outcomes[1]
    assert isinstance(second, PluginError)
    assert second.code == "FailedPrecondition"
    assert second.error_class is ErrorClass.FINAL
    # A final error: the caller removed what it made for pod-b.
    assert leftovers(layout) == []


async def test_without_the_capability_both_map_to_single_node_writer(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    outcomes, sent = await _publish_twice(plugin, driver, "vol-snw", ("ReadWriteOncePod",))
    assert sent == ["SINGLE_NODE_WRITER"] * 2
    assert not any(isinstance(o, PluginError) for o in outcomes)
    assert leftovers(layout) == []


# ------------------------------------------------------------------ mount group


async def test_fs_group_goes_to_a_driver_with_volume_mount_group(
    start_driver: StartDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    drv = start_driver("--volume-mount-group")
    plugin = await make_plugin(drv.endpoint)
    handle = new_volume(drv, "vol-group")
    dev_req = request(plugin, handle, fs_group=4321)
    pod_req = request(plugin, handle, pod_uid="pod-a", fs_group=4321)
    cap = volume_capability(pod_req, plugin.caps)
    assert cap.mount.volume_mount_group == "4321"
    staged = await plugin.mount_device(dev_req)
    assert "volume_mount_group" not in staged.detail, staged.detail
    result = await plugin.set_up(pod_req)
    assert result.mount_found is True
    assert "volume_mount_group" not in result.detail, result.detail
    assert os.stat(pod_req.mount_path).st_gid == 4321  # type: ignore[arg-type]
    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_fs_group_is_applied_by_volfsm_for_a_driver_without_mount_group(
    driver: DriverProcess, plugin: CsiPlugin
) -> None:
    """No VOLUME_MOUNT_GROUP: nothing is sent; ext4 + ReadWriteOnce under the default
    fsGroupPolicy (no CSIDriver object): the kubelet's ownership pass runs after NodePublish."""
    handle = new_volume(driver, "vol-nogroup")
    dev_req = request(plugin, handle, fs_group=4321)
    pod_req = request(plugin, handle, pod_uid="pod-a", fs_group=4321)
    assert volume_capability(pod_req, plugin.caps).mount.volume_mount_group == ""
    await plugin.mount_device(dev_req)  # the driver refuses volume_mount_group it does not offer
    result = await plugin.set_up(pod_req)
    assert result.ownership.startswith("fsGroup 4321: ")
    assert pod_req.mount_path is not None and pod_req.mount_path.stat().st_gid == 4321
    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)
