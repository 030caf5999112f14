"""Drivers departing from the spec: what they did is recorded, nothing crashes, errors are clear."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from google.protobuf import wrappers_pb2

from tests.csiplugin.conftest import MakePlugin
from tests.csiplugin.helpers import leftovers, request
from tests.csiplugin.hostile import (
    RPC,
    HostileDriver,
    mount_tmpfs,
    umount_all,
    with_raw,
    with_unknown_bytes,
)
from tests.helpers.csidriver import mounts_at
from volfsm.csi.v1 import csi_pb2
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import ErrorClass, PluginError
from volfsm.plugins.csi.client import BAD_RESPONSE

HANDLE = "hostile-vol"
HUGE = 5 * 1024 * 1024


async def test_ok_to_everything_and_mounting_nothing_is_recorded(
    hostile: HostileDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    plugin = await make_plugin(hostile.endpoint)
    dev_req = request(plugin, HANDLE)
    pod_req = request(plugin, HANDLE, pod_uid="pod-a")

    staged = await plugin.mount_device(dev_req)
    assert staged.mount_found is False
    assert "driver reported success but nothing is mounted there" in staged.detail
    published = await plugin.set_up(pod_req)
    assert published.mount_found is False
    assert "nothing is mounted there" in published.detail
    assert [r.staging_target_path for r in hostile.requests("NodePublishVolume")] == [
        str(dev_req.device_mount_path)
    ]

    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_unknown_for_a_mkdir_failure_is_a_clear_final_error(
    hostile: HostileDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    plugin = await make_plugin(hostile.endpoint)

    def fail(req: Any, ctx: Any) -> Any:
        ctx.abort(grpc.StatusCode.UNKNOWN, f"mkdir {req.target_path}: no such file or directory")

    hostile.behaviour["NodePublishVolume"] = fail
    dev_req = request(plugin, HANDLE)
    pod_req = request(plugin, HANDLE, pod_uid="pod-a")
    await plugin.mount_device(dev_req)
    with pytest.raises(PluginError) as err:
        await plugin.set_up(pod_req)
    assert err.value.code == "Unknown"
    assert err.value.error_class is ErrorClass.FINAL
    assert f"NodePublishVolume: mkdir {pod_req.mount_path}" in err.value.message
    assert not pod_req.mount_path.parent.exists()  # type: ignore[union-attr]
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


def _tmpfs_driver(hostile: HostileDriver) -> None:
    """Stage and publish mount a fresh read-write tmpfs each, whatever was asked."""

    def stage(req: Any, ctx: Any) -> Any:
        mount_tmpfs(req.staging_target_path)
        return csi_pb2.NodeStageVolumeResponse()

    def publish(req: Any, ctx: Any) -> Any:
        if not mounts_at(req.target_path):  # "idempotent": OK, whatever the arguments
            mount_tmpfs(req.target_path)
        return csi_pb2.NodePublishVolumeResponse()

    def unpublish(req: Any, ctx: Any) -> Any:
        if os.path.isdir(req.target_path):
            umount_all(req.target_path)
            os.rmdir(req.target_path)
        return csi_pb2.NodeUnpublishVolumeResponse()

    def unstage(req: Any, ctx: Any) -> Any:
        umount_all(req.staging_target_path)
        return csi_pb2.NodeUnstageVolumeResponse()

    hostile.behaviour.update(
        NodeStageVolume=stage,
        NodePublishVolume=publish,
        NodeUnpublishVolume=unpublish,
        NodeUnstageVolume=unstage,
    )


async def test_ok_where_already_exists_was_due_and_the_wrong_mounts_are_recorded(
    hostile: HostileDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    plugin = await make_plugin(hostile.endpoint)
    _tmpfs_driver(hostile)
    dev_req = request(plugin, HANDLE)
    pod_rw = request(plugin, HANDLE, pod_uid="pod-a")
    pod_ro = request(plugin, HANDLE, pod_uid="pod-a", read_only=True)

    staged = await plugin.mount_device(dev_req)
    assert staged.mount_found is True
    assert "fs_type ext4 was requested but tmpfs is mounted" in staged.detail
    first = await plugin.set_up(pod_rw)
    assert "not the staged filesystem" in first.detail
    # Same target, now read-only: the spec wants ALREADY_EXISTS, the driver says OK.
    second = await plugin.set_up(pod_ro)
    assert second.mount_found is True
    assert "read-only was requested but the mount is read-write" in second.detail

    await plugin.tear_down(pod_ro)
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_unpublish_ok_but_still_mounted_is_uncertain_and_nothing_is_removed(
    hostile: HostileDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    plugin = await make_plugin(hostile.endpoint)
    _tmpfs_driver(hostile)
    honest_unpublish = hostile.behaviour["NodeUnpublishVolume"]
    honest_unstage = hostile.behaviour["NodeUnstageVolume"]
    hostile.behaviour["NodeUnpublishVolume"] = lambda req, ctx: (
        csi_pb2.NodeUnpublishVolumeResponse()
    )
    hostile.behaviour["NodeUnstageVolume"] = lambda req, ctx: csi_pb2.NodeUnstageVolumeResponse()
    dev_req = request(plugin, HANDLE)
    pod_req = request(plugin, HANDLE, pod_uid="pod-a")
    await plugin.mount_device(dev_req)
    await plugin.set_up(pod_req)

    with pytest.raises(PluginError) as err:
        await plugin.tear_down(pod_req)
    assert err.value.code == "StillMounted"
    assert err.value.error_class is ErrorClass.UNCERTAIN
    assert (pod_req.mount_path.parent / "vol_data.json").is_file()  # type: ignore[union-attr]
    hostile.behaviour["NodeUnpublishVolume"] = honest_unpublish
    await plugin.tear_down(pod_req)

    with pytest.raises(PluginError) as err:
        await plugin.unmount_device(dev_req)
    assert err.value.code == "StillMounted"
    hostile.behaviour["NodeUnstageVolume"] = honest_unstage
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_a_target_made_a_symlink_outside_the_root_is_not_followed(
    hostile: HostileDriver, make_plugin: MakePlugin, layout: RootLayout, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("must survive")
    plugin = await make_plugin(hostile.endpoint)

    def publish(req: Any, ctx: Any) -> Any:
        os.symlink(outside, req.target_path)
        return csi_pb2.NodePublishVolumeResponse()

    hostile.behaviour["NodePublishVolume"] = publish
    dev_req = request(plugin, HANDLE)
    pod_req = request(plugin, HANDLE, pod_uid="pod-a")
    await plugin.mount_device(dev_req)
    result = await plugin.set_up(pod_req)
    assert result.mount_found is False
    assert f"is a symlink (to '{outside}'); not followed" in result.detail
    await plugin.tear_down(pod_req)
    assert not os.path.lexists(pod_req.mount_path)  # type: ignore[arg-type]
    assert (outside / "precious").read_text() == "must survive"
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []


async def test_a_target_left_with_files_in_it_is_not_deleted(
    hostile: HostileDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    """The driver wrote into the unmounted target: that may be data; cleanup refuses."""
    plugin = await make_plugin(hostile.endpoint)

    def publish(req: Any, ctx: Any) -> Any:
        os.mkdir(req.target_path)
        Path(req.target_path, "data").write_text("written to the node's disk")
        return csi_pb2.NodePublishVolumeResponse()

    hostile.behaviour["NodePublishVolume"] = publish
    pod_req = request(plugin, HANDLE, pod_uid="pod-a")
    assert pod_req.mount_path is not None
    await plugin.mount_device(request(plugin, HANDLE))
    await plugin.set_up(pod_req)
    with pytest.raises(PluginError) as err:
        await plugin.tear_down(pod_req)
    assert err.value.code == "CleanupFailed"
    assert err.value.error_class is ErrorClass.UNCERTAIN
    assert "is not empty" in err.value.message
    assert (pod_req.mount_path / "data").is_file()


@pytest.mark.parametrize(
    ("rpc", "answer", "message"),
    [
        ("GetPluginInfo", csi_pb2.GetPluginInfoResponse(), "driver name '' is not"),
        ("GetPluginInfo", csi_pb2.GetPluginInfoResponse(name="../../etc"), "'../../etc' is not"),
        ("GetPluginInfo", csi_pb2.GetPluginInfoResponse(name="x" * 5000), "'xxxxx"),
        ("NodeGetInfo", csi_pb2.NodeGetInfoResponse(), "node_id '' must be 1-256 bytes"),
        ("NodeGetInfo", csi_pb2.NodeGetInfoResponse(node_id="n" * 300), "must be 1-256 bytes"),
        (
            "NodeGetInfo",
            csi_pb2.NodeGetInfoResponse(node_id="n", max_volumes_per_node=-3),
            "max_volumes_per_node -3 is negative",
        ),
        # node_id (a string, field 1) sent as a varint: parsed as an unknown field.
        ("NodeGetInfo", with_raw(csi_pb2.NodeGetInfoResponse(), b"\x08\x96\x01"), "node_id ''"),
    ],
)
async def test_missing_or_absurd_identity_fields_are_refused(
    hostile: HostileDriver, make_plugin: MakePlugin, rpc: str, answer: Any, message: str
) -> None:
    hostile.behaviour[rpc] = lambda req, ctx: answer
    plugin = await make_plugin(hostile.endpoint, start=False)
    with pytest.raises(PluginError) as err:
        await plugin.start()
    assert err.value.code == BAD_RESPONSE
    assert err.value.error_class is ErrorClass.TRANSIENT
    assert message in err.value.message
    assert len(err.value.message) < 300
    assert plugin.info is None


async def test_not_ready_driver(hostile: HostileDriver, make_plugin: MakePlugin) -> None:
    hostile.behaviour["Probe"] = lambda req, ctx: csi_pb2.ProbeResponse(
        ready=wrappers_pb2.BoolValue(value=False)
    )
    plugin = await make_plugin(hostile.endpoint, start=False)
    with pytest.raises(PluginError) as err:
        await plugin.start()
    assert "says it is not ready" in err.value.message
    assert err.value.error_class is ErrorClass.TRANSIENT


async def test_odd_capabilities_are_ignored(
    hostile: HostileDriver, make_plugin: MakePlugin
) -> None:
    hostile.capabilities = [
        csi_pb2.NodeServiceCapability(),  # type oneof unset
        csi_pb2.NodeServiceCapability(rpc=RPC(type=cast(Any, 999))),  # unknown enum value
        csi_pb2.NodeServiceCapability(rpc=RPC(type=RPC.EXPAND_VOLUME)),
    ]
    plugin = await make_plugin(hostile.endpoint)
    assert plugin.caps.expand and not plugin.caps.stage_unstage


async def test_huge_replies_are_resource_exhausted_and_uncertain(
    hostile: HostileDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    plugin = await make_plugin(hostile.endpoint)
    hostile.behaviour["NodeStageVolume"] = lambda req, ctx: with_unknown_bytes(
        csi_pb2.NodeStageVolumeResponse(), HUGE
    )
    dev_req = request(plugin, HANDLE)
    with pytest.raises(PluginError) as err:
        await plugin.mount_device(dev_req)
    assert err.value.code == "ResourceExhausted"
    assert err.value.error_class is ErrorClass.UNCERTAIN
    assert dev_req.device_mount_path.is_dir()  # type: ignore[union-attr]
    await plugin.unmount_device(dev_req)
    assert leftovers(layout) == []

    hostile.behaviour["NodeGetInfo"] = lambda req, ctx: csi_pb2.NodeGetInfoResponse(
        node_id="n" * HUGE
    )
    fresh = await make_plugin(hostile.endpoint, start=False)
    with pytest.raises(PluginError) as err:
        await fresh.start()
    assert err.value.code == "ResourceExhausted"
    assert len(err.value.message) < 300


async def test_odd_expand_and_stats_replies(
    hostile: HostileDriver, make_plugin: MakePlugin
) -> None:
    plugin = await make_plugin(hostile.endpoint)
    pod_req = request(plugin, HANDLE, pod_uid="pod-a")
    # capacity_bytes missing: the requested size stands.
    assert await plugin.expand(pod_req, 123 * 1024 * 1024) == 123 * 1024 * 1024
    hostile.behaviour["NodeExpandVolume"] = lambda req, ctx: csi_pb2.NodeExpandVolumeResponse(
        capacity_bytes=-1
    )
    with pytest.raises(PluginError) as err:
        await plugin.expand(pod_req, 1)
    assert err.value.code == BAD_RESPONSE
    sent = hostile.requests("NodeExpandVolume")[0]
    assert sent.capacity_range.required_bytes == 123 * 1024 * 1024
    assert sent.volume_path == str(pod_req.mount_path)

    usage = csi_pb2.VolumeUsage
    hostile.behaviour["NodeGetVolumeStats"] = lambda req, ctx: csi_pb2.NodeGetVolumeStatsResponse(
        usage=[usage(total=10), usage(total=100, used=5, unit=usage.BYTES)]
    )
    assert await plugin.volume_stats(pod_req) == {
        "bytes_total": 100,
        "bytes_used": 5,
        "bytes_available": 0,
    }
    hostile.behaviour["NodeGetVolumeStats"] = lambda req, ctx: csi_pb2.NodeGetVolumeStatsResponse(
        usage=[usage(total=-5, unit=usage.INODES)]
    )
    with pytest.raises(PluginError) as err:
        await plugin.volume_stats(pod_req)
    assert "inodes total -5 is negative" in err.value.message


async def test_long_error_messages_are_cut_and_huge_ones_exhaust(
    hostile: HostileDriver, make_plugin: MakePlugin, layout: RootLayout
) -> None:
    plugin = await make_plugin(hostile.endpoint)
    size = [6000]

    def fail(req: Any, ctx: Any) -> Any:
        ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "x" * size[0])

    hostile.behaviour["NodeStageVolume"] = fail
    req = request(plugin, HANDLE)
    with pytest.raises(PluginError) as err:
        await plugin.mount_device(req)
    assert err.value.code == "InvalidArgument" and err.value.final
    assert len(err.value.message) < 1100
    assert err.value.message.endswith("(6000 chars)")
    assert leftovers(layout) == []

    # A megabyte status message is over gRPC's metadata limit: the client sees
    # ResourceExhausted, which is not final (the driver may have done the work).
    size[0] = 1 << 20
    with pytest.raises(PluginError) as err:
        await plugin.mount_device(req)
    assert err.value.code == "ResourceExhausted"
    assert err.value.error_class is ErrorClass.UNCERTAIN
    assert len(err.value.message) < 1100
    await plugin.unmount_device(req)
    assert leftovers(layout) == []
