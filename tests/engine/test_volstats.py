"""The volume stats gatherer with a plugin that has no NodeGetVolumeStats: statvfs of the mount.

(The CSI path, with volfsm's driver and its volume condition, is in
tests/service/test_volume_stats.py.)
"""

from __future__ import annotations

import dataclasses
import os

from events.types import VolumeUsageChanged
from tests.engine.conftest import FAST, EngineFactory
from tests.engine.helpers import envelopes, eventually
from tests.engine.objects import claim_volume, inline_csi_volume, pod, pv_set
from volfsm.engine.volstats import SOURCE_STATVFS, usage_of_statvfs
from volfsm.plugins.scripted import ScriptedPlugin

STATS = dataclasses.replace(FAST, volume_stats_period=0.05, volume_stats_jitter=False)


async def test_pvc_volumes_are_measured_with_statvfs_first_pod_wins(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    engine = await make_engine(plugin, config=STATS)
    first = pod("u1", claim_volume("data", "pv-a"), inline_csi_volume("scratch"), name="web-0")
    second = pod("u2", claim_volume("data", "pv-a"), name="web-1")
    await engine.apply([*pv_set("pv-a"), first])
    await engine.wait_pod("u1", "mounted", timeout=10)
    await engine.apply([second])
    await engine.wait_pod("u2", "mounted", timeout=10)
    await eventually(lambda: len(engine.volstats.stats) == 2, "both pods measured")

    [claim] = engine.volstats.by_claim()
    assert (claim.namespace, claim.claim, claim.pod_uid) == ("default", "pv-a", "u1")
    assert claim.usage is not None and claim.abnormal is None  # statvfs has no condition
    mount = engine.asw.podvols[("u1", "data")].mount_path
    expected = usage_of_statvfs(os.statvfs(mount))
    assert claim.usage.source == SOURCE_STATVFS
    assert claim.usage.capacity_bytes == expected.capacity_bytes
    assert claim.usage.inodes == expected.inodes  # (used ones change: the dir is on /tmp)
    status = engine.pod("u1")
    assert status is not None
    data = next(v for v in status.volumes if v.name == "data")
    scratch = next(v for v in status.volumes if v.name == "scratch")
    assert data.claim == "pv-a" and data.capacity_bytes == expected.capacity_bytes
    assert scratch.capacity_bytes is None  # not PVC-backed: not measured

    await eventually(lambda: engine.volstats.gatherings >= 6, "a few more periods")
    recorded = [e.body for e in envelopes(engine.log) if isinstance(e.body, VolumeUsageChanged)]
    assert sorted(b.pod_uid for b in recorded) == ["u1", "u2"]  # once each, not every period

    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=10)
    await eventually(lambda: len(engine.volstats.stats) == 1, "u1 forgotten")
    [claim] = engine.volstats.by_claim()
    assert claim.pod_uid == "u2"
