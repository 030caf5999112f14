"""The node's own admission rules with volfsm's CSI driver: ReadWriteOncePod, spec.nodeName.

The driver runs without SINGLE_NODE_MULTI_WRITER, so a ReadWriteOncePod
volume is sent as SINGLE_NODE_WRITER and the driver would publish it to a
second target: the engine's guard is all that keeps the second pod off it.
One driver serves the module (each test uses its own volume).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from events.types import OperationStarted, PodAdded, VolumeUnmounted
from tests.enginecsi.conftest import MakeStack
from tests.enginecsi.helpers import (
    NODE,
    assert_nothing_left,
    bodies,
    delete_and_wait,
    pod,
    pv,
    pvc,
)
from tests.helpers.csidriver import DriverProcess, cleanup_under, create_volume, mounts_at
from volfsm.cli.ops import WaitFor, explain_wait, print_pods
from volfsm.errors import InvalidObjectError

NODE_RPCS = ("NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume")


@pytest.fixture(scope="module")
def shared_driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DriverProcess]:
    """One driver for the module; stopped, and everything under it cleaned, at its end."""
    drv = DriverProcess(tmp_path_factory.mktemp("rwop-driver"))
    try:
        yield drv.start()
    finally:
        drv.close()
        cleanup_under(drv.workdir)


def rwop_volume(handle: str) -> list[dict[str, Any]]:
    """PV pv-`handle` (ReadWriteOncePod) and claim default/data bound to it."""
    return [pv(f"pv-{handle}", handle, access="ReadWriteOncePod"), pvc("data", f"pv-{handle}")]


def on_node(obj: dict[str, Any], node: str) -> dict[str, Any]:
    """The pod with spec.nodeName set."""
    obj["spec"]["nodeName"] = node
    return obj


def node_calls(drv: DriverProcess, handle: str) -> list[str]:
    """The driver's stage/publish/unpublish/unstage calls for a volume, with their codes."""
    return [f"{c['rpc']} {c['code']}" for c in drv.calls(volume_id=handle) if c["rpc"] in NODE_RPCS]


async def test_a_second_pod_on_a_rwop_claim_waits_for_the_first_to_go(
    shared_driver: DriverProcess, make_stack: MakeStack, capsys: pytest.CaptureFixture[str]
) -> None:
    drv = shared_driver
    create_volume(drv.clients(), "rwop1")
    stack = await make_stack(drv)
    engine, layout = stack.engine, stack.layout
    await engine.apply([*rwop_volume("rwop1"), on_node(pod("a", "data"), NODE)])
    await engine.wait_pod("a", "mounted", timeout=120)
    target_a = layout.csi_publish_path("a", "pv-rwop1")
    (target_a / "owner.txt").write_text("pod a")

    # Act: a second pod on the same claim
    await engine.apply([pod("b", "data")])
    await engine.settle(timeout=60)

    # Assert: b waits, naming the holder; a is untouched
    status = engine.pod("b")
    assert status is not None and status.phase == "Pending"
    [vol] = status.volumes
    why = "claim default/data is ReadWriteOncePod and in use by pod default/pod-a (uid a)"
    assert (vol.state, vol.waiting) == ("Unmounted", why)
    items = msgspec.to_builtins(engine.pods())  # as `volfsm get pods` receives them
    print_pods({"node": NODE, "items": items})
    assert f"default/pod-b data waiting: {why}\n" in capsys.readouterr().out
    [pod_b] = [p for p in items if p["uid"] == "b"]
    assert explain_wait([pod_b], WaitFor.mounted) == f"volume data is Unmounted; waiting: {why}"
    assert node_calls(drv, "rwop1") == ["NodeStageVolume OK", "NodePublishVolume OK"]
    assert len(mounts_at(target_a)) == 1
    assert (target_a / "owner.txt").read_text() == "pod a"
    assert list(drv.volume_record("rwop1")["published"]) == [str(target_a)]

    # Act: the holder goes
    assert await engine.delete_pod(uid="a")
    await engine.wait_pod("b", "mounted", timeout=120)

    # Assert: b mounted only after a's unpublish, on the same staged device
    target_b = layout.csi_publish_path("b", "pv-rwop1")
    assert (target_b / "owner.txt").read_text() == "pod a"
    assert node_calls(drv, "rwop1") == [
        "NodeStageVolume OK",
        "NodePublishVolume OK",
        "NodeUnpublishVolume OK",
        "NodePublishVolume OK",
    ]
    envs = list(stack.log.read_after(0))
    unmounted_a = next(e.seq for e in envs if isinstance(e.body, VolumeUnmounted))
    mounts_b = [
        e.seq
        for e in envs
        if isinstance(e.body, OperationStarted)
        and e.body.operation == "volume_mount"
        and e.body.pod_uid == "b"
    ]
    assert mounts_b and min(mounts_b) > unmounted_a
    status = engine.pod("b")
    assert status is not None and status.volumes[0].waiting == ""

    await delete_and_wait(engine, ["b"], ["rwop1"])
    assert_nothing_left(drv, layout, ["rwop1"])


async def test_a_pod_for_another_node_is_refused_and_nothing_is_published(
    shared_driver: DriverProcess, make_stack: MakeStack, tmp_path: Path
) -> None:
    drv = shared_driver
    create_volume(drv.clients(), "elsewhere1")
    stack = await make_stack(drv)
    engine = stack.engine
    objects = [
        pv("pv-elsewhere1", "elsewhere1"),
        pvc("elsewhere", "pv-elsewhere1"),
        on_node(pod("x", "elsewhere"), "node-2"),
    ]

    with pytest.raises(InvalidObjectError) as info:
        await engine.apply(objects)

    assert str(info.value) == (
        'Pod default/pod-x: spec.nodeName: "node-2" is not this node ("node-1")'
    )
    assert bodies(stack.log, PodAdded) == []
    assert stack.log.last_seq() == 0
    assert engine.dsw.persistent_volume("pv-elsewhere1") is None  # all or nothing
    await engine.settle(timeout=60)
    assert node_calls(drv, "elsewhere1") == []
    assert mounts_at(stack.layout.csi_publish_path("x", "pv-elsewhere1")) == []
