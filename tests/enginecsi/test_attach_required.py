"""CSIDriver `attachRequired` drives the attach step as the kubelet's CanAttach / skipAttach.

No CSIDriver object, or `attachRequired: true`: the volume is attachable, its
mount waits for attach (volfsm has no attach/detach controller: the attach
is taken as done, and WaitForAttach gives the VolumeAttachment name as the
device path) and records `DeviceAttached(attachable=True)`. `attachRequired:
false`: not attachable, no wait, `DeviceAttached(attachable=False)` with no
device path, straight to staging. The driver sees the same Node calls either
way and never a Controller call (volfsm attaches nothing itself).
"""

from __future__ import annotations

from typing import Any

from events.streams import device_stream
from events.types import DeviceAttached
from tests.enginecsi.conftest import Stack
from tests.enginecsi.helpers import (
    DRIVER,
    MIB,
    NODE,
    assert_nothing_left,
    bodies,
    claimed_volume,
    delete_and_wait,
    device_events,
    pod,
    volume_id,
)
from tests.helpers.csidriver import create_volume
from volfsm.plugins.csi.paths import attachment_id


def _csi_driver(attach_required: bool) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": DRIVER},
        "spec": {"attachRequired": attach_required},
    }


def _attached(stack: Stack, handle: str) -> DeviceAttached:
    [body] = bodies(stack.log, DeviceAttached, device_stream(volume_id(handle)))
    return body


async def _mount(stack: Stack, handle: str, uid: str) -> None:
    assert stack.driver is not None
    create_volume(stack.driver.clients(), handle, 32 * MIB)
    await stack.engine.apply([*claimed_volume(f"pv-{handle}", handle), pod(uid, f"pv-{handle}")])
    status = await stack.engine.wait_pod(uid, "mounted", timeout=120)
    assert status is not None and status.phase == "Mounted"


async def test_attach_required_decides_whether_the_mount_waits_for_attach(stack: Stack) -> None:
    drv, engine = stack.driver, stack.engine
    assert drv is not None
    stack.plugin.objects.lookup = engine.objects.csi_driver  # as `volfsm serve` wires it

    await _mount(stack, "absent", "pod-absent")  # no CSIDriver object: attach required
    await engine.apply([_csi_driver(False)])
    await _mount(stack, "skip", "pod-skip")
    await engine.apply([_csi_driver(True)])
    await _mount(stack, "required", "pod-required")

    for handle in ("absent", "required"):
        found = _attached(stack, handle)
        assert found.attachable, handle
        assert found.device_path == attachment_id(handle, DRIVER, NODE)
        assert engine.asw.devices[volume_id(handle)].attachable
    skipped = _attached(stack, "skip")
    assert (skipped.attachable, skipped.device_path) == (False, "")
    assert not engine.asw.devices[volume_id("skip")].attachable

    for handle in ("absent", "skip", "required"):
        assert device_events(stack.log, handle) == [
            "DeviceAttached",
            "VolumeResized",
            "DeviceMounted",
        ]
        # Nothing but the provisioning and the Node calls: no ControllerPublishVolume.
        rpcs = [c["rpc"] for c in drv.calls(volume_id=handle)]
        assert rpcs == ["CreateVolume", "NodeStageVolume", "NodePublishVolume"], (handle, rpcs)

    uids = ["pod-absent", "pod-skip", "pod-required"]
    await delete_and_wait(engine, uids, ["absent", "skip", "required"])
    assert_nothing_left(drv, stack.layout, ["absent", "skip", "required"])
