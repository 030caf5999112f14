"""Error classes as the kubelet's, and what the caller removes after each (real driver faults)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import pytest

from tests.csiplugin.conftest import MakePlugin
from tests.csiplugin.helpers import leftovers, new_volume, request
from tests.helpers.csidriver import DriverProcess, mounts_at
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import ErrorClass, PluginError
from volfsm.plugins.csi.errors import NON_GRPC_CODE, classify, code_name
from volfsm.plugins.csi.plugin import CsiPlugin

T = TypeVar("T")


async def retry_aborted(call: Callable[[], Awaitable[T]], attempts: int = 50) -> T:
    """Call again while the driver answers ABORTED (another call holds the volume)."""
    for _ in range(attempts - 1):
        try:
            return await call()
        except PluginError as exc:
            if exc.code != "Aborted":
                raise
        await asyncio.sleep(0.05)
    return await call()


NON_FINAL = {"Canceled", "DeadlineExceeded", "Unavailable", "ResourceExhausted", "Aborted"}
CODES = [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK]


def test_code_names_are_the_go_spellings() -> None:
    names = {code_name(c) for c in CODES}
    assert names >= NON_FINAL
    assert "Canceled" in names and "Cancelled" not in names
    assert {"InvalidArgument", "NotFound", "FailedPrecondition", "Unknown"} <= names


def test_non_grpc_errors_are_uncertain() -> None:
    err = classify(ValueError("bad bytes"), "NodeStageVolume")
    assert err.code == NON_GRPC_CODE
    assert err.error_class is ErrorClass.UNCERTAIN
    assert "ValueError: bad bytes" in err.message
    again = PluginError("X", "y", ErrorClass.FINAL)
    assert classify(again, "NodeStageVolume") is again


async def test_every_stage_error_code_is_classified_and_cleaned_up_as_kubelet(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    handle = new_volume(driver, "vol-codes")
    dev_req = request(plugin, handle)
    staging = dev_req.device_mount_path
    assert staging is not None
    for code in CODES:
        driver.set_faults(
            [{"rpc": "NodeStageVolume", "action": "error", "code": code.name, "message": "boom"}]
        )
        with pytest.raises(PluginError) as err:
            await plugin.mount_device(dev_req)
        name = code_name(code)
        assert err.value.code == name
        assert err.value.message == "NodeStageVolume: boom"
        if name in NON_FINAL:
            assert err.value.error_class is ErrorClass.UNCERTAIN, name
            # The driver may still be working on it: the caller keeps what it made.
            assert staging.is_dir(), name
            assert (staging.parent / "vol_data.json").is_file(), name
            driver.clear_faults()
            await plugin.unmount_device(dev_req)  # the reverse call cleans up
        else:
            assert err.value.error_class is ErrorClass.FINAL, name
            assert not staging.parent.exists(), name
        assert leftovers(layout) == [], name
    driver.clear_faults()


async def test_publish_final_error_removes_the_pod_dir_non_final_keeps_it(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    handle = new_volume(driver, "vol-pub-err")
    dev_req = request(plugin, handle)
    pod_req = request(plugin, handle, pod_uid="pod-a")
    target = pod_req.mount_path
    assert target is not None
    await plugin.mount_device(dev_req)

    driver.set_faults([{"rpc": "NodePublishVolume", "action": "error", "code": "NOT_FOUND"}])
    with pytest.raises(PluginError) as err:
        await plugin.set_up(pod_req)
    assert err.value.final
    assert not target.parent.exists()

    driver.set_faults([{"rpc": "NodePublishVolume", "action": "error", "code": "ABORTED"}])
    with pytest.raises(PluginError) as err:
        await plugin.set_up(pod_req)
    assert err.value.error_class is ErrorClass.UNCERTAIN
    assert (target.parent / "vol_data.json").is_file()

    # "after": the driver did the work but the answer was lost.
    driver.set_faults(
        [{"rpc": "NodePublishVolume", "action": "error", "code": "UNAVAILABLE", "when": "after"}]
    )
    with pytest.raises(PluginError) as err:
        await plugin.set_up(pod_req)
    assert err.value.error_class is ErrorClass.UNCERTAIN
    assert mounts_at(target)  # mounted although the call "failed": why it is uncertain

    driver.clear_faults()
    assert (await plugin.set_up(pod_req)).mount_found is True  # the retry converges
    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_teardown_errors_keep_everything(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    handle = new_volume(driver, "vol-td-err")
    dev_req = request(plugin, handle)
    pod_req = request(plugin, handle, pod_uid="pod-a")
    await plugin.mount_device(dev_req)
    await plugin.set_up(pod_req)
    for code, klass in (
        ("INTERNAL", ErrorClass.FINAL),
        ("DEADLINE_EXCEEDED", ErrorClass.UNCERTAIN),
    ):
        driver.set_faults([{"rpc": "NodeUnpublishVolume", "action": "error", "code": code}])
        with pytest.raises(PluginError) as err:
            await plugin.tear_down(pod_req)
        assert err.value.error_class is klass
        assert mounts_at(pod_req.mount_path)  # type: ignore[arg-type]
        assert (pod_req.mount_path.parent / "vol_data.json").is_file()  # type: ignore[union-attr]
    driver.clear_faults()
    await plugin.tear_down(pod_req)
    driver.set_faults([{"rpc": "NodeUnstageVolume", "action": "error", "code": "INTERNAL"}])
    with pytest.raises(PluginError):
        await plugin.unmount_device(dev_req)
    assert (dev_req.device_mount_path.parent / "vol_data.json").is_file()  # type: ignore[union-attr]
    driver.clear_faults()
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_a_hung_call_times_out_as_deadline_exceeded_and_keeps_the_dirs(
    driver: DriverProcess, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    plugin = await make_plugin(driver.endpoint, timeout_s=0.5)
    handle = new_volume(driver, "vol-hang")
    dev_req = request(plugin, handle)
    pod_req = request(plugin, handle, pod_uid="pod-a")
    staging = dev_req.device_mount_path
    assert staging is not None
    driver.set_faults([{"rpc": "NodeStageVolume", "action": "hang", "times": 1}])
    with pytest.raises(PluginError) as err:
        await plugin.mount_device(dev_req)
    assert err.value.code == "DeadlineExceeded"
    assert err.value.error_class is ErrorClass.UNCERTAIN
    assert staging.is_dir() and (staging.parent / "vol_data.json").is_file()

    # The driver still holds the volume until it notices the cancel: ABORTED, retry with backoff.
    staged = await retry_aborted(lambda: plugin.mount_device(dev_req))
    assert staged.mount_found is True
    driver.set_faults([{"rpc": "NodePublishVolume", "action": "hang", "times": 1}])
    with pytest.raises(PluginError) as err:
        await plugin.set_up(pod_req)
    assert err.value.code == "DeadlineExceeded"
    assert (pod_req.mount_path.parent / "vol_data.json").is_file()  # type: ignore[union-attr]
    driver.clear_faults()
    await retry_aborted(lambda: plugin.tear_down(pod_req))  # the reverse call
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_driver_crash_mid_stage_is_uncertain_and_the_retry_converges(
    driver: DriverProcess, plugin: CsiPlugin, layout: RootLayout
) -> None:
    handle = new_volume(driver, "vol-crash")
    dev_req = request(plugin, handle)
    driver.set_faults([{"rpc": "NodeStageVolume", "action": "crash", "when": "after", "times": 1}])
    with pytest.raises(PluginError) as err:
        await plugin.mount_device(dev_req)
    assert err.value.error_class is ErrorClass.UNCERTAIN
    assert err.value.code == "Unavailable"
    driver.wait_exit()
    driver.start()
    assert (await plugin.mount_device(dev_req)).mount_found is True
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []
