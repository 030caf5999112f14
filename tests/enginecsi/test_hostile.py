"""Malformed and hostile driver replies reach the engine without hurting it.

The driver here is the scripted one of tests/csiplugin/hostile.py, served in
this process, plus replies that are not protobuf at all (hostile_raw.py).
Whatever it sends (garbage bytes, megabyte replies and messages, missing
identity fields, the wrong kind of file where a device belongs, a symlink
out of the root), the engine keeps running and answering, records the error
(cut to a readable length) or what it found, does not call the pod Mounted
unless the driver said so, and still tears everything down when the pod
goes, with the driver still hostile.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from events.types import DeviceMounted, VolumeMounted
from tests.csiplugin.helpers import request
from tests.csiplugin.hostile import with_raw, with_unknown_bytes
from tests.enginecsi.conftest import MakeStack, Stack
from tests.enginecsi.helpers import (
    bodies,
    claimed_volume,
    device_state,
    eventually,
    failed,
    mounts_under,
    pod,
    podvol_state,
    root_leftovers,
    wait_gone,
)
from tests.enginecsi.hostile_raw import RawHostileDriver
from volfsm.csi.v1 import csi_pb2

HANDLE = "hostile-vol"
HUGE = 5 << 20
GARBAGE = b"\xff\xff\xff\xff"  # a varint that never ends: not a protobuf message


def _abort(code: grpc.StatusCode, message: str) -> Callable[[Any, Any], Any]:
    def answer(req: Any, ctx: Any) -> Any:
        ctx.abort(code, message)

    return answer


def _publish_makes(kind: str) -> Callable[[Any, Any], Any]:
    """A block publish that says OK but leaves a directory (or nothing) at the target."""

    def answer(req: Any, ctx: Any) -> Any:
        if kind == "directory" and not os.path.isdir(req.target_path):
            os.mkdir(req.target_path)
        return csi_pb2.NodePublishVolumeResponse()

    return answer


@dataclass(frozen=True)
class Case:
    """One hostile behaviour and what the engine must record for it."""

    rpc: str
    operation: str
    code: str
    final: bool
    device: str | None = None
    podvol: str | None = None
    mode: str = "Filesystem"
    raw: bytes | None = None
    behaviour: Callable[[Any, Any], Any] | None = None


CASES = {
    "stage reply is not protobuf": Case(
        "NodeStageVolume",
        "volume_mount",
        "Internal",
        final=True,
        device="Attached",  # a final error changes nothing
        podvol="Unmounted",
        raw=GARBAGE,
    ),
    "stage reply of 5 MiB": Case(
        "NodeStageVolume",
        "volume_mount",
        "ResourceExhausted",
        final=False,
        device="Uncertain",  # not final: the stage may have happened
        podvol="Unmounted",
        behaviour=lambda req, ctx: with_unknown_bytes(csi_pb2.NodeStageVolumeResponse(), HUGE),
    ),
    "publish error message of 1 MiB": Case(
        "NodePublishVolume",
        "volume_mount",
        "ResourceExhausted",
        final=False,
        device="DeviceGloballyMounted",
        podvol="Uncertain",
        behaviour=_abort(grpc.StatusCode.INVALID_ARGUMENT, "x" * (1 << 20)),
    ),
    "publish error message of 6000 chars": Case(
        "NodePublishVolume",
        "volume_mount",
        "InvalidArgument",
        final=True,
        device="DeviceGloballyMounted",
        podvol="Unmounted",
        behaviour=_abort(grpc.StatusCode.INVALID_ARGUMENT, "y" * 6000),
    ),
    "block publish leaves no device": Case(
        "NodePublishVolume",
        "map_volume",
        "MapBlockVolumeFailed",
        final=False,
        device="DeviceGloballyMounted",
        podvol="Uncertain",
        mode="Block",
        behaviour=_publish_makes("nothing"),
    ),
    "block publish leaves a directory": Case(
        "NodePublishVolume",
        "map_volume",
        "MapBlockVolumeFailed",
        final=False,
        device="DeviceGloballyMounted",
        mode="Block",
        behaviour=_publish_makes("directory"),
    ),
}


def _assert_alive_and_pending(stack: Stack) -> None:
    engine = stack.engine
    assert engine.alive
    status = engine.pod("pod-a")
    assert status is not None and status.phase == "Pending"
    assert [p.uid for p in engine.pods()] == ["pod-a"]
    assert engine.volumes()


async def _delete_and_check_clean(stack: Stack) -> None:
    if "pod-a" in stack.engine.dsw.pods:
        assert await stack.engine.delete_pod(uid="pod-a")
    await wait_gone(stack.engine, ["pod-a"], [HANDLE])
    assert stack.engine.alive
    assert mounts_under(stack.root) == []
    assert root_leftovers(stack.layout) == []


@pytest.mark.parametrize("name", list(CASES))
async def test_hostile_reply_is_recorded_and_the_pod_is_not_mounted(
    hostile: RawHostileDriver, make_stack: MakeStack, name: str
) -> None:
    case = CASES[name]
    if case.raw is not None:
        hostile.raw[case.rpc] = case.raw
    if case.behaviour is not None:
        hostile.behaviour[case.rpc] = case.behaviour
    stack = await make_stack(hostile)
    engine, log = stack.engine, stack.log
    await engine.apply([*claimed_volume("pv-h", HANDLE, mode=case.mode), pod("pod-a", "pv-h")])
    await eventually(lambda: bool(failed(log, case.operation)), f"{case.operation} failed")
    await eventually(lambda: len(failed(log, case.operation)) >= 2, "a retry failed as well")

    first = failed(log, case.operation)[0].body
    assert (first.code, first.final) == (case.code, case.final)
    assert len(first.message) < 1200
    if "chars" in name:
        assert first.message.endswith("(6000 chars)")
    assert hostile.requests(case.rpc)
    _assert_alive_and_pending(stack)
    if case.device is not None:
        assert device_state(engine, HANDLE) == case.device
    if case.podvol is not None:
        assert podvol_state(engine, "pod-a") == case.podvol
    assert bodies(log, VolumeMounted) == []

    await _delete_and_check_clean(stack)  # the driver is still hostile


@pytest.mark.parametrize(
    ("rpc", "reply", "code", "message"),
    [
        ("NodeGetInfo", csi_pb2.NodeGetInfoResponse(), "BadDriverResponse", "node_id ''"),
        # name (a string, field 1) sent as a varint: parsed as an unknown field, name missing
        (
            "GetPluginInfo",
            with_raw(csi_pb2.GetPluginInfoResponse(), b"\x08\x96\x01"),
            "BadDriverResponse",
            "driver name ''",
        ),
        ("NodeGetCapabilities", GARBAGE, "Internal", "could not be parsed"),
    ],
)
async def test_bad_identity_replies_block_nothing_but_the_driver_and_heal(
    hostile: RawHostileDriver,
    make_stack: MakeStack,
    rpc: str,
    reply: Any,
    code: str,
    message: str,
) -> None:
    """The plugin cannot start: every operation fails before the driver is used (no state
    change, retried with backoff); once the driver answers sanely the pod mounts."""
    if isinstance(reply, bytes):
        hostile.raw[rpc] = reply
    else:
        hostile.behaviour[rpc] = lambda req, ctx: reply
    stack = await make_stack(hostile, start_plugin=False)
    engine, log = stack.engine, stack.log
    await engine.apply([*claimed_volume("pv-h", HANDLE), pod("pod-a", "pv-h")])
    await eventually(lambda: len(failed(log, "volume_mount")) >= 2, "mount retried")

    for env in failed(log, "volume_mount"):
        assert (env.body.code, env.body.final) == (code, False)
        assert message in env.body.message
    _assert_alive_and_pending(stack)
    assert device_state(engine, HANDLE) == "Attached"
    assert podvol_state(engine, "pod-a") == "Unmounted"
    assert hostile.requests("NodeStageVolume") == []

    hostile.raw.clear()
    hostile.behaviour.clear()  # the default driver: OK to everything, mounts nothing
    await engine.wait_pod("pod-a", "mounted", timeout=60)
    assert [b.mount_found for b in bodies(log, DeviceMounted)] == [False]
    assert [b.mount_found for b in bodies(log, VolumeMounted)] == [False]
    await _delete_and_check_clean(stack)


async def test_publish_that_plants_a_symlink_is_recorded_and_not_followed(
    hostile: RawHostileDriver, make_stack: MakeStack, tmp_path: Path
) -> None:
    """A symlink out of the root at the publish target: recorded as "nothing mounted", and
    never handed back to the driver (NodeUnpublish on a link could unmount through it)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("must survive")
    unpublished_links: list[bool] = []

    def publish(req: Any, ctx: Any) -> Any:
        os.symlink(outside, req.target_path)
        return csi_pb2.NodePublishVolumeResponse()

    def unpublish(req: Any, ctx: Any) -> Any:
        unpublished_links.append(os.path.islink(req.target_path))
        return csi_pb2.NodeUnpublishVolumeResponse()

    hostile.behaviour.update(NodePublishVolume=publish, NodeUnpublishVolume=unpublish)
    stack = await make_stack(hostile)
    engine, log = stack.engine, stack.log
    await engine.apply([*claimed_volume("pv-h", HANDLE), pod("pod-a", "pv-h")])
    await engine.wait_pod("pod-a", "mounted", timeout=60)  # the driver said OK: kubelet's rule

    [mounted] = bodies(log, VolumeMounted)
    assert mounted.mount_found is False  # ... but the log says what was really there
    target = stack.layout.csi_publish_path("pod-a", "pv-h")
    assert os.path.islink(target)

    assert await engine.delete_pod(uid="pod-a")
    await eventually(
        lambda: (
            podvol_state(engine, "pod-a") == "Unmounted"
            or any(f.body.code == "UnsafePath" for f in failed(log, "volume_unmount"))
        ),
        "the teardown done or refused",
    )
    if podvol_state(engine, "pod-a") != "Unmounted":
        # Today the engine refuses the symlinked path before the plugin is called
        # (TRANSIENT UnsafePath, retried): the pod stays Terminating until someone
        # removes the link. See the H-csi report.
        assert engine.alive and engine.pod("pod-a") is not None
        assert (outside / "precious").read_text() == "must survive"
        os.unlink(target)
    await _delete_and_check_clean(stack)
    assert True not in unpublished_links
    assert (outside / "precious").read_text() == "must survive"
    assert not os.path.lexists(target)


async def test_plugin_removes_a_symlinked_target_without_asking_the_driver(
    hostile: RawHostileDriver, make_stack: MakeStack, tmp_path: Path
) -> None:
    """The plugin's half of the symlink case: were the engine to pass such a target on,
    NodeUnpublishVolume is not called with it (umount would follow the link)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    stack = await make_stack(hostile)
    plugin = stack.plugin
    dev_req = request(plugin, HANDLE)
    pod_req = request(plugin, HANDLE, pod_uid="pod-a")
    assert pod_req.mount_path is not None
    await plugin.mount_device(dev_req)

    def publish(req: Any, ctx: Any) -> Any:
        os.symlink(outside, req.target_path)
        return csi_pb2.NodePublishVolumeResponse()

    hostile.behaviour["NodePublishVolume"] = publish
    result = await plugin.set_up(pod_req)
    assert result.mount_found is False and "is a symlink" in result.detail
    await plugin.tear_down(pod_req)
    assert hostile.requests("NodeUnpublishVolume") == []
    assert not os.path.lexists(pod_req.mount_path) and outside.is_dir()
    await plugin.unmount_device(dev_req)
    # The pod's own directories stay for the engine's pod cleanup; nothing else.
    assert root_leftovers(stack.layout) == [
        "pods/pod-a/",
        "pods/pod-a/volumes/",
        "pods/pod-a/volumes/kubernetes.io~csi/",
    ]
