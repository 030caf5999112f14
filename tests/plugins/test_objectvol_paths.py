"""Object volumes check their own paths: a planted symlink fails the mount or the remount.

The engine skips its `confined` pre-check for these plugins (`walks_pod_path`):
SetUp's `RootLayout.ensure_dir` walks the pod path following no symlink before
anything is written. Here a real engine with the real plugins, its object store
and the update wiring of `volfsm serve`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from events.log import EventLog
from tests.engine.helpers import eventually, failures, podvol_state
from volfsm.engine import EngineConfig, VolumeEngine
from volfsm.node.atomicwriter import TS_DIR_RE, read_payload
from volfsm.node.layout import RootLayout
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.objectvol.plugin import ObjectVolumes, object_plugins
from volfsm.plugins.objectvol.updates import ObjectUpdates

VOLUME = "pods/u1/volumes/kubernetes.io~configmap/cfg"


def config_map(value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": "default"},
        "data": {"key": value},
    }


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
    "spec": {"volumes": [{"name": "cfg", "configMap": {"name": "cm"}}]},
}


@pytest.fixture
async def engine(tmp_path: Path, layout: RootLayout) -> AsyncIterator[VolumeEngine]:
    shared = ObjectVolumes()
    catalog = PluginCatalog()
    for plugin in object_plugins(layout, shared):
        catalog.register(plugin)
    log = EventLog(tmp_path / "volfsm.db", node="n1")
    engine = VolumeEngine(log, layout.root, catalog, EngineConfig())
    shared.store = engine.objects
    updates = ObjectUpdates(engine.objects, engine, shared, asyncio.get_running_loop())
    await engine.start()
    try:
        yield engine
    finally:
        updates.close()
        await engine.stop()
        log.close()
        assert shared.reaper.wait_idle(30)


async def test_a_symlink_in_the_pod_dir_fails_the_mount_before_anything_is_written(
    engine: VolumeEngine, layout: RootLayout, outside: Path
) -> None:
    (layout.root / "pods/u1").mkdir(parents=True)
    os.symlink(outside, layout.root / "pods/u1/volumes")
    await engine.apply([config_map("v1"), POD])
    await eventually(lambda: bool(failures(engine.log)), "refused mount")
    refused = failures(engine.log)[0]
    assert refused.code == "UnsafePath" and not refused.final
    assert "symlink" in refused.message
    assert podvol_state(engine, "u1", "cfg") == "Unmounted"
    os.unlink(layout.root / "pods/u1/volumes")
    await engine.wait_pod("u1", "mounted", timeout=10)
    assert read_payload(layout.root / VOLUME) == {"key": b"v1"}


async def test_a_symlink_swapped_in_for_a_mounted_volume_fails_its_remount(
    engine: VolumeEngine, layout: RootLayout, outside: Path
) -> None:
    await engine.apply([config_map("v1"), POD])
    await engine.wait_pod("u1", "mounted", timeout=10)
    volume = layout.root / VOLUME
    os.rename(volume, volume.with_name("moved-away"))
    os.symlink(outside, volume)
    await engine.apply([config_map("v2")])  # asks for a remount
    await eventually(lambda: bool(failures(engine.log)), "refused remount")
    refused = failures(engine.log)[0]
    assert (refused.operation, refused.code, refused.final) == ("volume_mount", "UnsafePath", False)
    assert podvol_state(engine, "u1", "cfg") == "Mounted"  # a failed remount never downgrades
    os.unlink(volume)
    os.rename(volume.with_name("moved-away"), volume)
    await eventually(lambda: read_payload(volume) == {"key": b"v2"}, "the retried remount")
    await eventually(
        lambda: len([n for n in os.listdir(volume) if TS_DIR_RE.match(n)]) == 1,
        "the replaced payload dir reaped",
    )
