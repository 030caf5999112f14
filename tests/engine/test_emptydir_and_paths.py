"""Real emptyDir through the engine (directories, tmpfs) and path safety of plugin paths."""

from __future__ import annotations

import os
from pathlib import Path

from volfsm.desired.resolve import empty_dir_volume_id
from volfsm.node import mounts
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import VolumeRequest
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.emptydir import EmptyDirPlugin
from volfsm.plugins.scripted import ScriptedPlugin

from .conftest import EngineFactory, catalog_of
from .helpers import eventually, failures, podvol_state
from .objects import claim_volume, empty_dir_volume, pod, pv_set

MIB = 1 << 20


def empty_dir_catalog(root: Path) -> PluginCatalog:
    catalog = PluginCatalog()
    catalog.register(EmptyDirPlugin(RootLayout(root)))
    return catalog


def mount_at(path: Path) -> mounts.MountInfo | None:
    """What /proc/self/mountinfo shows mounted exactly at `path`."""
    return mounts.find_mount(os.path.realpath(path))


async def test_empty_dir_directory_is_created_for_the_pod_and_removed_after_it(
    make_engine: EngineFactory, root: Path
) -> None:
    engine = await make_engine(catalog=empty_dir_catalog(root))
    await engine.apply([pod("u1", empty_dir_volume("cache"))])
    status = await engine.wait_pod("u1", "mounted", timeout=5)
    assert status is not None
    volume_dir = root / "pods/u1/volumes/kubernetes.io~empty-dir/cache"
    assert Path(status.volumes[0].mount_path) == volume_dir.resolve()
    assert volume_dir.is_dir() and (volume_dir.stat().st_mode & 0o777) == 0o777
    (volume_dir / "data.txt").write_text("written by the pod")
    (volume_dir / "sub").mkdir()
    vid = empty_dir_volume_id("u1", "cache")
    assert engine.asw.devices[vid].state == "Attached"  # pod-scoped, never staged
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    await eventually(lambda: vid not in engine.asw.devices, "emptyDir volume detached")
    await eventually(lambda: not (root / "pods/u1").exists(), "pod dir removed")
    await engine.reconciler.wait_cleanup()
    assert list((root / "pods").iterdir()) == []


async def test_memory_empty_dir_is_a_size_limited_tmpfs_and_is_cleaned_up(
    make_engine: EngineFactory, root: Path
) -> None:
    engine = await make_engine(catalog=empty_dir_catalog(root))
    await engine.apply([pod("u1", empty_dir_volume("shm", medium="Memory", size_limit="16Mi"))])
    status = await engine.wait_pod("u1", "mounted", timeout=5)
    assert status is not None
    volume_dir = Path(status.volumes[0].mount_path)
    info = mount_at(volume_dir)
    assert info is not None and info.fstype == "tmpfs"
    assert info.super_option("size") == f"{16 * MIB // 1024}k"
    assert engine.asw.podvols[("u1", "shm")].mount_path == str(volume_dir)
    (volume_dir / "big").write_bytes(b"x" * MIB)
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    assert mount_at(volume_dir) is None
    assert not mounts.mounts_under(root)
    await eventually(lambda: not (root / "pods/u1").exists(), "pod dir removed")


class EscapingPlugin(ScriptedPlugin):
    """A plugin whose publish path points out of the root dir."""

    def pod_mount_path(self, root: Path, req: VolumeRequest) -> Path:
        return root / "pods" / req.pod_uid / ".." / ".." / ".." / "outside" / "mount"


async def test_a_plugin_path_outside_the_root_is_refused_before_the_plugin_is_called(
    make_engine: EngineFactory, root: Path
) -> None:
    plugin = EscapingPlugin()
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await eventually(lambda: len(failures(engine.log)) >= 2, "refused mounts")
    refused = failures(engine.log)[0]
    assert refused.code == "UnsafePath" and not refused.final
    assert plugin.calls("set_up") == 0
    assert podvol_state(engine, "u1", "data") == "Unmounted"  # before the plugin: no change
    assert not (root.parent / "outside").exists()


async def test_a_symlink_planted_in_the_pod_dir_is_not_followed(
    make_engine: EngineFactory, root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    plugin = ScriptedPlugin()
    # Planted after start: one found at start is an orphan, kept and reported (never followed)
    # once the desired state is complete (tests/reconstruct).
    engine = await make_engine(plugin, catalog=catalog_of(plugin))
    (root / "pods/u1").mkdir(parents=True)
    os.symlink(outside, root / "pods/u1/volumes")  # planted: pods/u1/volumes -> outside
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await eventually(lambda: bool(failures(engine.log)), "refused mount")
    assert failures(engine.log)[0].code == "UnsafePath"
    assert "symlink" in failures(engine.log)[0].message
    assert plugin.calls("set_up") == 0
    assert list(outside.iterdir()) == []  # nothing created through the link
    os.unlink(root / "pods/u1/volumes")
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert list(outside.iterdir()) == []


async def test_a_symlink_planted_at_a_mounted_volume_is_removed_not_followed_on_teardown(
    make_engine: EngineFactory, root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the pod's")
    engine = await make_engine(catalog=empty_dir_catalog(root))
    await engine.apply([pod("u1", empty_dir_volume("cache"))])
    await engine.wait_pod("u1", "mounted", timeout=5)
    volume_dir = root / "pods/u1/volumes/kubernetes.io~empty-dir/cache"
    os.rmdir(volume_dir)
    os.symlink(outside, volume_dir)  # planted while Mounted: the teardown must not follow it
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=10)  # not stuck on UnsafePath
    await eventually(lambda: not (root / "pods/u1").exists(), "pod dir removed")
    assert (outside / "keep.txt").read_text() == "not the pod's"
