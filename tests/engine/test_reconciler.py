"""The reconciler's dirty set and full-pass screen: nothing missed, idle volumes cost nothing."""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec

from projections.asw import Asw
from volfsm.engine.reconciler import VERIFY_CHUNK, VERIFY_EVERY
from volfsm.plugins.scripted import ScriptedPlugin, final, nonfinal

from .conftest import FAST, EngineFactory
from .helpers import eventually, failures
from .objects import claim_volume, pod, pv, pv_set, volume_id_of

STUCK = dataclasses.replace(FAST, backoff_initial=60.0, backoff_max=60.0)
"""Failures back off for a minute: whatever failed stays to do during the test."""


async def test_full_pass_screen_finds_every_kind_of_work_and_skips_idle_volumes(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True, expandable=True)
    vid = {name: volume_id_of(name) for name in ("idle", "mnt", "umnt", "unstage", "grow", "re")}
    plugin.script("set_up", final("Internal"), volume_id=vid["mnt"])
    plugin.script("tear_down", final("Internal"), volume_id=vid["umnt"])
    plugin.script("unmount_device", final("Internal"), volume_id=vid["unstage"])
    plugin.script("expand", nonfinal("Unavailable"), volume_id=vid["grow"])
    engine = await make_engine(plugin, config=STUCK)
    objects = []
    for name in vid:
        objects += [*pv_set(name), pod(f"pod-{name}", claim_volume("data", name))]
    await engine.apply(objects)
    for name in ("idle", "umnt", "unstage", "grow", "re"):
        await engine.wait_pod(f"pod-{name}", "mounted", timeout=5)
    await engine.delete_pod(uid="pod-umnt")
    await engine.delete_pod(uid="pod-unstage")
    await engine.apply([pv("grow", size="2Gi")])
    plugin.script("set_up", final("Internal"), volume_id=vid["re"])
    engine.remount("pod-re")
    await eventually(lambda: len(failures(engine.log)) == 5, "five stuck operations")
    await engine.settle()

    assert engine.reconciler.screen() == {vid[n] for n in ("mnt", "umnt", "unstage", "grow", "re")}
    stats = engine.reconciler.full_pass()
    assert stats.volumes == 5 and stats.started == 0 and stats.refused == 5  # all backing off
    assert engine.reconciler.reconcile().volumes == 0  # nothing dirty: an idle pass is free


async def test_a_change_wakes_the_reconciler_without_waiting_for_the_period(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    slow = dataclasses.replace(FAST, reconcile_period=3600.0, full_resync_period=3600.0)
    engine = await make_engine(plugin, config=slow)
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await engine.wait_pod("u1", "mounted", timeout=5)  # woken by the apply, then by each finish
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    await eventually(lambda: volume_id_of("v1") not in engine.asw.devices, "detached")


async def test_a_restart_shares_the_states_strings_and_keeps_its_values_and_its_screen(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    vid = {name: volume_id_of(name) for name in ("idle", "mnt", "umnt")}
    plugin.script("set_up", final("Internal"), volume_id=vid["mnt"])
    plugin.script("tear_down", final("Internal"), volume_id=vid["umnt"])
    first = await make_engine(plugin, config=STUCK)
    objects = []
    for name in vid:
        objects += [*pv_set(name), pod(f"pod-{name}", claim_volume("data", name))]
    await first.apply(objects)
    for name in ("idle", "umnt"):
        await first.wait_pod(f"pod-{name}", "mounted", timeout=5)
    await first.delete_pod(uid="pod-umnt")
    await eventually(lambda: len(failures(first.log)) == 2, "two stuck operations")
    await first.settle()
    await first.stop()

    second = await make_engine(plugin, config=STUCK)
    await second.settle()
    folded = Asw()
    second.log.replay(folded.apply, until_seq=second.asw.last_seq)
    for mine, fresh in ((second.asw.podvols, folded.podvols), (second.asw.devices, folded.devices)):
        assert list(mine) == list(fresh)  # same entries, same order
        assert msgspec.to_builtins(list(mine.values())) == msgspec.to_builtins(list(fresh.values()))
    wanted = second.dsw.desired_entries()
    for key in second.asw.podvols:
        if key in wanted:
            assert any(key is own for own in wanted)  # one key object, compared by identity
    held = [key for keys in second.index.holders.values() for key in keys]
    assert second.index.held == {key: held.count(key) for key in held}
    assert second.reconciler.screen() == {vid["mnt"], vid["umnt"]}


async def test_every_verify_every_th_full_pass_finds_work_whose_screen_byte_went_wrong(
    make_engine: EngineFactory,
) -> None:
    """The full pass does not rest on the events keeping the screen's bytes alone."""
    plugin = ScriptedPlugin()
    plugin.script("set_up", final("Internal"), volume_id=volume_id_of("lost"))
    engine = await make_engine(plugin, config=STUCK)
    await engine.apply([*pv_set("lost"), pod("pod-lost", claim_volume("data", "lost"))])
    await eventually(lambda: len(failures(engine.log)) == 1, "a stuck mount")
    await engine.settle()
    reconciler = engine.reconciler
    column = reconciler.columns.podvols
    column.bits[column.ids[("pod-lost", "data")]] = 0  # the work hidden from the sweep
    found = []
    for _ in range(VERIFY_EVERY):
        found.append(reconciler.full_pass().volumes)
        await asyncio.sleep(0.01)  # the check runs in parts on the loop
    assert 1 in found  # found within VERIFY_EVERY passes, missed only before the check
    first = found.index(1)
    assert found == [0] * first + [1] * (VERIFY_EVERY - first)
    assert reconciler.columns.stale() == []


async def test_the_check_of_the_columns_goes_in_parts_and_repairs_what_it_finds(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin()
    engine = await make_engine(plugin)
    objects = []
    for i in range(VERIFY_CHUNK // 4 + 3):  # more pod-volume keys than one part holds
        objects += [*pv_set(f"v{i}"), pod(f"pod-{i}", claim_volume("data", f"v{i}"))]
    await engine.apply(objects)
    await engine.wait_pod("pod-0", "mounted", timeout=30)
    await engine.settle(60)
    columns = engine.reconciler.columns
    assert len(columns.all_keys()[0]) > VERIFY_CHUNK
    column = columns.podvols
    column.bits[column.ids[("pod-1", "data")]] ^= 0xFF
    assert await engine.reconciler.verify_columns() == ["pod-volume ('pod-1', 'data')"]
    assert columns.stale() == [] and await engine.reconciler.verify_columns() == []
