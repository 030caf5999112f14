"""What survives a restart because it is in the log (kubelet loses all of it, reference §4)."""

from __future__ import annotations

import dataclasses

from tests.helpers.logcheck import assert_log_matches
from volfsm.plugins.scripted import ScriptedPlugin, final

from .conftest import FAST, EngineFactory
from .helpers import eventually, failures
from .objects import claim_volume, pod, pv, pv_set, volume_id_of

V1 = volume_id_of("v1")
GI = 1 << 30
STUCK = dataclasses.replace(FAST, backoff_initial=60.0, backoff_max=60.0)


async def test_a_failed_mount_keeps_its_backoff_across_a_restart(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    plugin.script("set_up", final("PermissionDenied"))
    first = await make_engine(plugin, config=STUCK)
    await first.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await eventually(lambda: bool(failures(first.log)), "the failed mount")
    await first.stop()
    assert_log_matches(first)

    second = await make_engine(plugin, config=STUCK)
    assert second.pending.retry_at(V1) is not None  # seeded from the log, keyed per volume
    passes = second.reconciler.passes
    await eventually(lambda: second.reconciler.passes > passes + 5, "passes after the restart")
    second.reconciler.full_pass()
    assert plugin.calls("set_up") == 1  # kubelet would retry at once: its backoff is memory
    status = second.pod("u1")
    assert status is not None and status.volumes[0].next_retry_us is not None


async def test_a_final_expansion_error_is_remembered_across_a_restart(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True, expandable=True)
    plugin.script("expand", final("FailedPrecondition", "volume in use"))
    first = await make_engine(plugin)
    await first.apply([*pv_set("v1", size="1Gi"), pod("u1", claim_volume("data", "v1"))])
    await first.wait_pod("u1", "mounted", timeout=5)
    await first.apply([pv("v1", size="2Gi")])
    await eventually(lambda: bool(failures(first.log, "volume_fs_resize")), "expansion failed")
    await first.settle()
    await first.stop()
    assert_log_matches(first)

    second = await make_engine(plugin)
    passes = second.reconciler.passes
    await eventually(lambda: second.reconciler.passes > passes + 5, "passes after the restart")
    second.reconciler.full_pass()
    await second.settle()
    assert plugin.calls("expand") == 1
    await second.apply([pv("v1", size="3Gi")])  # a new size is worth a new try
    await eventually(lambda: second.asw.devices[V1].size_bytes == 3 * GI, "grown")


async def test_an_in_use_expansion_error_during_mount_is_remembered_across_a_restart(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True, expandable=True)
    plugin.script("expand", final("FailedPrecondition", "volume in use"))
    first = await make_engine(plugin)
    claim = pv_set("v1", size="2Gi", claim_capacity="1Gi")
    await first.apply([*claim, pod("u1", claim_volume("data", "v1"))])
    await first.wait_pod("u1", "mounted", timeout=5)
    await first.stop()

    second = await make_engine(plugin)
    assert second.generator.expand_in_use == {V1: 2 * GI}
    await second.apply([*claim, pod("u2", claim_volume("data", "v1"))])  # objects: not logged
    await second.wait_pod("u2", "mounted", timeout=5)
    assert plugin.calls("expand") == 1  # kubelet would forget it and ask again
