"""ReadWriteOncePod with the scripted plugin: one pod mounts the volume, the others wait.

The real-driver scenario is tests/enginecsi/test_rwop.py; these cover what
a real driver makes slow or hard to arrange: a restart, a mount in flight
when its pod is deleted, a first pod whose mount keeps failing.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from volfsm.engine import PodWaitTimeoutError, VolumeEngine
from volfsm.plugins.scripted import ScriptedPlugin, final, ok

from .conftest import FAST, EngineFactory
from .helpers import eventually, podvol_state
from .objects import claim_volume, pod, pv, pvc, volume_id_of

STUCK = dataclasses.replace(FAST, backoff_initial=60.0, backoff_max=60.0)


def rwop_claim(name: str = "data") -> list[dict[str, Any]]:
    """A ReadWriteOncePod PV and a claim default/`name` bound to it."""
    volume = pv(f"pv-{name}")
    volume["spec"]["accessModes"] = ["ReadWriteOncePod"]
    return [volume, pvc(name, f"pv-{name}")]


def user(uid: str, claim: str = "data") -> dict[str, Any]:
    """Pod default/pod-`uid` with volume "vol" on `claim`."""
    return pod(uid, claim_volume("vol", claim))


def waiting(engine: VolumeEngine, uid: str) -> str:
    """Why the pod's volume "vol" waits ("" if it does not)."""
    status = engine.pod(uid)
    assert status is not None
    return status.volumes[0].waiting


async def some_passes(engine: VolumeEngine, count: int = 5) -> None:
    """Let the reconciler run a few passes over every volume."""
    passes = engine.reconciler.passes
    engine.reconciler.mark_all_dirty()
    engine.reconciler.wake()
    await eventually(lambda: engine.reconciler.passes > passes + count, "reconcile passes")
    await engine.settle()


def calls(plugin: ScriptedPlugin) -> list[tuple[str, str]]:
    """(method, pod uid) of the plugin's pod-level calls, in order."""
    return [(c.method, c.pod_uid) for c in plugin.call_log if c.method in ("set_up", "tear_down")]


async def test_a_pod_mounted_on_an_rwop_claim_keeps_it_across_a_restart_while_a_second_waits(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    first = await make_engine(plugin)
    await first.apply([*rwop_claim(), user("a")])
    await first.wait_pod("a", "mounted", timeout=5)
    await first.apply([user("b")])
    await some_passes(first)
    holder = "claim default/data is ReadWriteOncePod and in use by pod default/pod-a (uid a)"
    assert waiting(first, "b") == holder
    assert waiting(first, "a") == ""
    await first.stop()

    second = await make_engine(plugin)
    await some_passes(second)
    assert podvol_state(second, "a", "vol") == "Mounted"
    assert podvol_state(second, "b", "vol") == "Unmounted"
    assert waiting(second, "b") == holder
    assert calls(plugin) == [("set_up", "a")]  # a kept its mount: no tear_down, no remount
    with pytest.raises(PodWaitTimeoutError, match="vol is Unmounted; waiting: claim default/data"):
        await second.wait_pod("b", "mounted", timeout=0.2)

    assert await second.delete_pod(uid="a")
    await second.wait_pod("b", "mounted", timeout=5)
    assert calls(plugin) == [("set_up", "a"), ("tear_down", "a"), ("set_up", "b")]
    assert waiting(second, "b") == ""


async def test_a_pod_deleted_while_its_mount_runs_holds_the_claim_until_it_is_unmounted(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin()  # plain: mounts of different pods are not serialised by key
    gate = asyncio.Event()
    plugin.script("set_up", ok(gate=gate))
    engine = await make_engine(plugin)
    await engine.apply([*rwop_claim(), user("a"), user("b")])
    await eventually(lambda: plugin.calls("set_up") == 1, "a's mount running")
    assert podvol_state(engine, "a", "vol") == "Unmounted"  # running: not holding it yet

    assert await engine.delete_pod(uid="a")
    passes = engine.reconciler.passes
    await eventually(lambda: engine.reconciler.passes > passes + 5, "passes")
    assert calls(plugin) == [("set_up", "a")]
    assert "in use by pod default/pod-a (uid a)" in waiting(engine, "b")

    gate.set()
    await engine.wait_pod("b", "mounted", timeout=5)
    assert calls(plugin) == [("set_up", "a"), ("tear_down", "a"), ("set_up", "b")]


async def test_the_pod_applied_first_gets_the_claim_even_while_its_mount_fails(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin()
    plugin.script("set_up", final("PermissionDenied"), volume_id=volume_id_of("pv-data"))
    engine = await make_engine(plugin, config=STUCK)
    await engine.apply(
        [*rwop_claim(), user("a"), user("b"), *rwop_claim("other"), user("c", "other")]
    )
    await some_passes(engine)
    assert sorted(calls(plugin)) == [("set_up", "a"), ("set_up", "c")]
    assert waiting(engine, "b") == (
        "claim default/data is ReadWriteOncePod and goes to pod default/pod-a (uid a), "
        "applied first"
    )
    assert podvol_state(engine, "c", "vol") == "Mounted"  # another claim: not held back

    assert await engine.delete_pod(uid="a")
    await engine.wait_pod("b", "mounted", timeout=5)
