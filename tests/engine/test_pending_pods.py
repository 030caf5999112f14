"""Pending pods in the engine: waits name the claim; --complete and delete see them."""

from __future__ import annotations

import pytest

from events.types import PodAdded
from volfsm.engine import PodWaitTimeoutError
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.scripted import ScriptedPlugin

from .conftest import EngineFactory
from .objects import claim_volume, inline_csi_volume, pod, pv_set


async def test_a_pending_pod_waits_is_kept_by_complete_and_mounts_on_its_claim(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    engine = await make_engine(plugin)
    result = await engine.apply([pod("u1", claim_volume("data", "c1"))])
    assert [str(r) for r in result.objects] == [
        "pod/default/pod-u1 created; waiting: data: PersistentVolumeClaim default/c1: not found yet"
    ]
    with pytest.raises(PodWaitTimeoutError, match="waiting: PersistentVolumeClaim default/c1"):
        await engine.wait_pod("u1", "mounted", timeout=0.05)
    assert not engine.pod_is("u1", "unmounted")  # desired, though nothing is mounted
    await engine.apply([pod("u1", claim_volume("data", "c1"))], complete=True)  # named: kept
    assert "u1" in engine.dsw.pending
    result = await engine.apply(pv_set("c1"))
    assert [str(r) for r in result.objects][-1] == "pod/default/pod-u1 no longer waiting"
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert plugin.calls("set_up") == 1


async def test_complete_and_delete_remove_pending_pods(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    engine = await make_engine(plugin)
    await engine.apply([pod("u1", claim_volume("data", "c1")), pod("u2", claim_volume("d", "c2"))])
    result = await engine.apply([], complete=True)
    assert [uid for uid, _, _ in result.deleted] == ["u1", "u2"]
    assert engine.dsw.pending == {} and engine.pods() == []
    assert engine.objects.get("Pod", "default", "pod-u1") is None  # its object went too
    await engine.apply([pod("u3", claim_volume("data", "c3"))])
    assert await engine.delete_pod(namespace="default", name="pod-u3")
    await engine.wait_pod("u3", "unmounted", timeout=5)
    assert not await engine.delete_pod(uid="u3")


async def test_a_pod_waits_for_its_csi_driver_across_a_restart(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    """Registration is not in the log: the pod stays `PodPending` through a restart and the
    `PodAdded` that the driver's registration brings is what the log keeps."""
    catalog = PluginCatalog()
    first = await make_engine(plugin, catalog=catalog)
    result = await first.apply([pod("u1", inline_csi_volume("scratch", plugin.driver))])
    why = f"scratch: CSI driver {plugin.driver}: not registered on this node yet"
    assert [str(r) for r in result.objects] == [f"pod/default/pod-u1 created; waiting: {why}"]
    assert await first.wake_csi_drivers([plugin.driver]) == []  # not registered: still waits
    await first.stop()
    again = await make_engine(plugin, catalog=catalog)
    assert list(again.dsw.pending) == ["u1"]
    catalog.register_csi_driver(plugin.driver, plugin)
    [added] = await again.wake_csi_drivers([plugin.driver])
    assert isinstance(added.body, PodAdded)
    await again.wait_pod("u1", "mounted", timeout=5)
    assert await again.wake_csi_drivers([plugin.driver]) == []
