"""The unmount gate: nothing is unmounted or removed until the desired state is complete.

Complete means told (`apply(..., complete=True)`, what `volfsm apply
--complete` sends) or the grace period after start has passed, the latter
only while the log knows what is on the node. Mounts run from the start.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.engine.helpers import eventually, operations
from tests.engine.objects import empty_dir_volume, pod
from volfsm.desired.errors import InvalidObjectError
from volfsm.engine import VolumeEngine
from volfsm.node import mounts

from .conftest import GATED, Node, with_grace

EMPTY = "kubernetes.io~empty-dir"


def mem_pod(uid: str) -> dict[str, object]:
    return pod(uid, empty_dir_volume("mem", medium="Memory"))


async def two_pods_then_restart(node: Node, config: object) -> VolumeEngine:
    first = await node.start()
    await first.apply([mem_pod("u1"), mem_pod("u2")])
    for uid in ("u1", "u2"):
        await first.wait_pod(uid, "mounted", timeout=30)
    await node.stop(check=True)
    return await node.start(config)  # type: ignore[arg-type]


async def test_a_pod_deleted_before_the_grace_period_ends_is_unmounted_only_after_it(
    node: Node,
) -> None:
    engine = await two_pods_then_restart(node, with_grace(2.0))
    mem2 = node.layout.pod_volume_dir("u2", EMPTY, "mem")
    assert not engine.desired_complete
    assert engine.recovery_status()["desired_grace_left_s"] is not None

    await engine.delete_pod(uid="u2")

    # While the grace period runs, u2 keeps its mount (checked on every look)
    looks = 0
    while not engine.desired_complete:
        assert mounts.find_mount(mem2) is not None, (
            "unmounted before the desired state was complete"
        )
        assert engine.asw.podvols[("u2", "mem")].state == "Mounted"
        looks += 1
        await eventually(lambda n=engine.reconciler.passes: engine.reconciler.passes > n, "pass")
    assert looks > 0
    # Then it goes, dir and all
    await engine.wait_pod("u2", "unmounted", timeout=30)
    await eventually(lambda: not node.layout.pod_dir("u2").exists(), "u2's pod dir removed")
    assert engine.recovery_status()["desired_complete_reason"] == (
        "grace period of 2s after start passed"
    )
    assert engine.pod_is("u1", "mounted")


async def test_without_a_grace_period_nothing_is_unmounted_until_told(node: Node) -> None:
    engine = await two_pods_then_restart(node, GATED)
    await engine.delete_pod(uid="u2")
    passes = engine.reconciler.passes
    await eventually(lambda: engine.reconciler.passes > passes + 20, "reconcile passes")
    assert engine.asw.podvols[("u2", "mem")].state == "Mounted"
    assert node.layout.pod_dir("u2").is_dir()
    assert engine.recovery_status()["desired_grace_left_s"] is None

    engine.set_desired_complete("told by the test")

    await engine.wait_pod("u2", "unmounted", timeout=30)


async def test_apply_complete_deletes_the_pods_it_does_not_name(node: Node) -> None:
    engine = await two_pods_then_restart(node, GATED)
    before = engine.asw.last_seq

    result = await engine.apply([mem_pod("u1")], complete=True)

    assert result.deleted == (("u2", "default", "pod-u2"),)
    assert [env.type for env in result.events] == ["PodRemoved", "ObjectDeleted"]
    assert result.events[0].seq == before + 1
    assert engine.desired_complete
    await engine.wait_pod("u2", "unmounted", timeout=30)
    await eventually(lambda: not node.layout.pod_dir("u2").exists(), "u2's pod dir removed")
    await engine.settle()
    assert engine.pod_is("u1", "mounted")
    started = [(op, stream) for op, stream in operations(engine.log) if "u1" in stream]
    assert started == [("volume_mount", "podvol/u1/mem")]  # from the first start only


async def test_a_bad_apply_complete_changes_nothing(node: Node) -> None:
    engine = await two_pods_then_restart(node, GATED)
    before = engine.asw.last_seq
    bad = pod("u3", {"name": "x", "hostPath": {"path": "/etc"}})

    with pytest.raises(InvalidObjectError):
        await engine.apply([mem_pod("u1"), bad], complete=True)

    assert engine.asw.last_seq == before
    assert not engine.desired_complete
    assert "u2" in engine.dsw.pods


async def test_a_fresh_node_needs_no_gate_but_a_restarted_one_keeps_it(node: Node) -> None:
    first = await node.start(GATED)
    assert first.desired_complete  # empty log, empty root dir: nothing to protect
    assert first.recovery_status()["desired_complete_reason"].startswith("fresh node")
    await first.apply([mem_pod("u1")])
    await first.wait_pod("u1", "mounted", timeout=30)
    await first.delete_pod(uid="u1")
    await first.wait_pod("u1", "unmounted", timeout=30)
    await first.apply([mem_pod("u2")])
    await first.wait_pod("u2", "mounted", timeout=30)
    await node.stop(check=True)

    second = await node.start(GATED)
    assert not second.desired_complete  # the log has history: wait to be told


async def test_after_a_lost_log_the_grace_period_does_not_open_the_gate(node: Node) -> None:
    # Arrange: a tmpfs pod mounted with data; the log goes
    first = await node.start()
    await first.apply([mem_pod("u1")])
    await first.wait_pod("u1", "mounted", timeout=30)
    mem = node.layout.pod_volume_dir("u1", EMPTY, "mem")
    (mem / "data.txt").write_text("still needed")
    await node.stop()
    node.lose_log()

    # Act: start with a short grace period; nobody re-applies the pod for several times it
    engine = await node.start(with_grace(0.2))
    status = engine.recovery_status()
    started = asyncio.get_running_loop().time()
    await eventually(
        lambda: asyncio.get_running_loop().time() > started + 1.0 and engine.reconciler.passes > 10,
        "five grace periods",
    )

    # Assert: the gate holds, says why, and the found volume is untouched
    assert status["desired_gate"] == "until_told" and status["desired_grace_left_s"] is None
    assert status["desired_wait_reason"] == (
        "the log has no record of 1 volume entry found on the node (the log was lost or is"
        " behind, or another tool wrote there)"
    )
    assert not engine.desired_complete
    assert engine.asw.podvols[("u1", "mem")].state == "Uncertain"
    assert mounts.find_mount(mem) is not None
    assert (mem / "data.txt").read_text() == "still needed"

    # Act / Assert: told, the found volume no pod wants goes
    engine.set_desired_complete("told by the test")
    await engine.wait_pod("u1", "unmounted", timeout=30)
