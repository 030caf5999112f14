"""The emptyDir plugin with real directories and real tmpfs mounts."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from events.types import VolumeSource
from tests.paths.nodekit import Janitor
from volfsm.node import mounts
from volfsm.node.dirsonly import remove_pod_dir
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import BLOCK, FILESYSTEM, ErrorClass, PluginError, VolumeRequest
from volfsm.plugins.emptydir import EmptyDirPlugin

ED = "kubernetes.io~empty-dir"
UID = "3d1e7c52-9d2f-4b8e-a1f0-6c5b4a392817"


def source(medium: str = "", size: int | None = None) -> VolumeSource:
    return VolumeSource(plugin="kubernetes.io/empty-dir", medium=medium, size_limit_bytes=size)


def request(
    plugin: EmptyDirPlugin, src: VolumeSource, uid: str = UID, name: str = "cache"
) -> VolumeRequest:
    req = VolumeRequest(volume_id=f"{uid}/{name}", source=src, pod_uid=uid, volume_name=name)
    return VolumeRequest(
        volume_id=req.volume_id,
        source=src,
        pod_uid=uid,
        volume_name=name,
        mount_path=plugin.pod_mount_path(plugin.layout.root, req),
    )


@pytest.fixture
def plugin(layout: RootLayout) -> EmptyDirPlugin:
    return EmptyDirPlugin(layout)


# ------------------------------------------------------------------ identity


def test_plugin_kind(plugin: EmptyDirPlugin) -> None:
    src = source()
    assert plugin.name == "kubernetes.io/empty-dir"
    assert plugin.supports(src)
    assert not plugin.supports(VolumeSource(plugin="kubernetes.io/csi", driver="d"))
    assert not plugin.is_attachable(src)
    assert not plugin.is_device_mountable(src)
    assert not plugin.supports_block(src)
    assert not plugin.supports_expansion(src)
    assert plugin.device_mount_path(plugin.layout.root, request(plugin, src)) is None


def test_can_serve_filesystem_with_default_or_memory_medium_only(plugin: EmptyDirPlugin) -> None:
    assert plugin.can_serve(source(), FILESYSTEM) is None
    assert plugin.can_serve(source("Memory", 1 << 20), FILESYSTEM) is None
    block = plugin.can_serve(source(), BLOCK)
    assert block is not None and "Block" in block
    huge = plugin.can_serve(source("HugePages"), FILESYSTEM)
    assert huge is not None and "HugePages" in huge


def test_pod_mount_path_is_kubelets_emptydir_path(plugin: EmptyDirPlugin) -> None:
    req = VolumeRequest(volume_id="v", source=source(), pod_uid=UID, volume_name="cache")
    root = plugin.layout.root
    assert plugin.pod_mount_path(root, req) == root / "pods" / UID / "volumes" / ED / "cache"


# ---------------------------------------------------------------- directory


async def test_set_up_creates_a_world_writable_dir_and_marks_it_ready(
    plugin: EmptyDirPlugin, layout: RootLayout
) -> None:
    req = request(plugin, source())
    result = await plugin.set_up(req)
    volume = layout.pod_volume_dir(UID, ED, "cache")
    assert result.path == os.fspath(volume)
    assert result.mount_found is None
    assert stat.S_IMODE(os.stat(volume).st_mode) == 0o777
    assert (layout.pod_plugin_dir(UID, ED, "cache") / "ready").is_file()
    assert not mounts.is_mount_point(volume)
    (volume / "kept").write_text("pod data")
    again = await plugin.set_up(req)
    assert again == result
    assert (volume / "kept").read_text() == "pod data"


async def test_tear_down_removes_the_dir_with_everything_the_pod_wrote(
    plugin: EmptyDirPlugin, layout: RootLayout, outside: Path
) -> None:
    req = request(plugin, source())
    await plugin.set_up(req)
    volume = layout.pod_volume_dir(UID, ED, "cache")
    (volume / "sub" / "deeper").mkdir(parents=True)
    (volume / "sub" / "deeper" / "file").write_text("x")
    (volume / "escape-file").symlink_to(outside / "precious.txt")
    (volume / "sub" / "escape-dir").symlink_to(outside / "etc")
    (volume / "sub" / "escape-root").symlink_to("/")
    os.link(outside / "etc" / "passwd", volume / "hardlink-out")
    await plugin.tear_down(req)
    assert not volume.exists()
    assert not layout.pod_plugin_dir(UID, ED, "cache").exists()
    assert (outside / "precious.txt").read_text().startswith("do not touch")
    await plugin.tear_down(req)  # idempotent
    assert remove_pod_dir(layout, UID).removed > 0 and not layout.pod_dir(UID).exists()


@pytest.mark.parametrize("medium", ["", "Memory"])
async def test_keep_files_tear_down_removes_directories_and_keeps_every_file(
    plugin: EmptyDirPlugin, layout: RootLayout, janitor: Janitor, outside: Path, medium: str
) -> None:
    # Arrange: a volume (the log never recorded creating it) holding files and empty dirs
    req = request(plugin, source(medium, 1 << 20))
    await plugin.set_up(req)
    volume = layout.pod_volume_dir(UID, ED, "cache")
    (volume / "empty" / "dirs").mkdir(parents=True)
    (volume / "sub").mkdir()
    (volume / "sub" / "data.bin").write_bytes(b"\x01\x02")
    (volume / "link-out").symlink_to(outside / "precious.txt")

    # Act
    kept = await plugin.tear_down(replace(req, keep_files=True))

    # Assert: every file there; the ready marker (the plugin's own) gone
    assert (volume / "sub" / "data.bin").read_bytes() == b"\x01\x02"
    assert (volume / "link-out").is_symlink()
    assert not layout.pod_plugin_dir(UID, ED, "cache").exists()
    assert kept is not None
    if medium:  # a tmpfs holding a file stays mounted, whole
        assert mounts.is_mount_point(volume) and (volume / "empty" / "dirs").is_dir()
        assert kept.startswith(f"the tmpfs at {volume} stays mounted: it holds what the log")
    else:
        assert not (volume / "empty").exists()
        assert f"kept: {volume}/sub/data.bin: a file the log did not create" in kept


async def test_keep_files_tear_down_unmounts_an_empty_tmpfs(
    plugin: EmptyDirPlugin, layout: RootLayout, janitor: Janitor
) -> None:
    req = request(plugin, source("Memory", 1 << 20))
    await plugin.set_up(req)
    volume = layout.pod_volume_dir(UID, ED, "cache")
    (volume / "only" / "dirs").mkdir(parents=True)
    assert await plugin.tear_down(replace(req, keep_files=True)) is None
    assert not mounts.is_mount_point(volume) and not volume.exists()


async def test_tear_down_of_a_volume_never_set_up_is_a_no_op(plugin: EmptyDirPlugin) -> None:
    await plugin.tear_down(request(plugin, source("Memory")))
    await plugin.tear_down(request(plugin, source(), uid="other-pod"))


async def test_two_pods_and_two_volumes_are_independent(
    plugin: EmptyDirPlugin, layout: RootLayout, janitor: Janitor
) -> None:
    reqs = [request(plugin, source(), uid=u, name=n) for u in ("pa", "pb") for n in ("x", "y")]
    for req in reqs:
        await plugin.set_up(req)
    await plugin.tear_down(reqs[0])
    assert not layout.pod_volume_dir("pa", ED, "x").exists()
    assert all(layout.pod_volume_dir(r.pod_uid, ED, r.volume_name).is_dir() for r in reqs[1:])


# ------------------------------------------------------------------- memory


async def test_memory_medium_mounts_a_size_limited_tmpfs_seen_in_mountinfo(
    plugin: EmptyDirPlugin, layout: RootLayout, janitor: Janitor
) -> None:
    req = request(plugin, source("Memory", 1 << 20))
    result = await plugin.set_up(req)
    volume = layout.pod_volume_dir(UID, ED, "cache")
    assert result.mount_found is True
    assert result.detail == "tmpfs size=1024k"
    found = [i for i in mounts.read_mountinfo() if i.mount_point == os.fspath(volume)]
    assert len(found) == 1
    assert (found[0].fstype, found[0].source) == ("tmpfs", "tmpfs")
    assert found[0].super_option("size") == "1024k"
    (volume / "in-memory").write_bytes(b"z" * 1000)
    with pytest.raises(OSError):
        (volume / "too-big").write_bytes(b"z" * (2 << 20))
    await plugin.set_up(req)  # idempotent: no second tmpfs stacked
    assert len([i for i in mounts.read_mountinfo() if i.mount_point == os.fspath(volume)]) == 1
    await plugin.tear_down(req)
    assert not any(i.mount_point == os.fspath(volume) for i in mounts.read_mountinfo())
    assert not volume.exists()
    assert janitor.leftovers() == ([], [])


async def test_memory_medium_without_a_limit_gets_the_kernel_default(
    plugin: EmptyDirPlugin, layout: RootLayout, janitor: Janitor
) -> None:
    result = await plugin.set_up(request(plugin, source("Memory")))
    found = mounts.find_mount(layout.pod_volume_dir(UID, ED, "cache"))
    assert result.mount_found is True
    assert found is not None and found.fstype == "tmpfs"
    assert found.super_option("size") is None  # tmpfs lists size= only when not the default
    assert result.detail == "tmpfs"
    await plugin.tear_down(request(plugin, source("Memory")))
    assert janitor.leftovers() == ([], [])


async def test_tear_down_unmounts_a_tmpfs_even_if_the_spec_lost_its_medium(
    plugin: EmptyDirPlugin, layout: RootLayout, janitor: Janitor
) -> None:
    await plugin.set_up(request(plugin, source("Memory", 1 << 20)))
    await plugin.tear_down(request(plugin, source()))  # e.g. a reconstructed spec
    assert janitor.leftovers() == ([], [])
    assert not layout.pod_volume_dir(UID, ED, "cache").exists()


async def test_tear_down_refuses_a_foreign_mount_inside_and_keeps_its_data(
    plugin: EmptyDirPlugin, layout: RootLayout, janitor: Janitor
) -> None:
    req = request(plugin, source())
    await plugin.set_up(req)
    inner = layout.pod_volume_dir(UID, ED, "cache") / "inner"
    inner.mkdir()
    mounts.mount_tmpfs(inner, 1 << 20)
    (inner / "data").write_text("someone else's")
    with pytest.raises(PluginError) as info:
        await plugin.tear_down(req)
    assert info.value.error_class is ErrorClass.UNCERTAIN
    assert info.value.code == "MountedInside"
    assert (inner / "data").read_text() == "someone else's"


async def test_memory_set_up_on_a_dir_that_is_another_kind_of_mount_is_uncertain(
    plugin: EmptyDirPlugin, layout: RootLayout, janitor: Janitor, tmp_path: Path
) -> None:
    volume = layout.ensure_dir(layout.pod_volume_dir(UID, ED, "cache"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    mounts.bind_mount(elsewhere, volume)
    with pytest.raises(PluginError) as info:
        await plugin.set_up(request(plugin, source("Memory", 1 << 20)))
    assert info.value.code == "MediumMismatch"
    assert info.value.error_class is ErrorClass.UNCERTAIN
    with pytest.raises(PluginError) as teardown:
        await plugin.tear_down(request(plugin, source("Memory", 1 << 20)))
    assert teardown.value.code == "MediumMismatch"
    assert elsewhere.is_dir()


async def test_a_failing_tmpfs_mount_is_final_and_leaves_no_mount(
    plugin: EmptyDirPlugin, layout: RootLayout, janitor: Janitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(target: str, size: int | None = None) -> None:
        raise mounts.MountError("mount", target, "ENOMEM", "Cannot allocate memory", 12)

    monkeypatch.setattr(mounts, "mount_tmpfs", refuse)
    with pytest.raises(PluginError) as info:
        await plugin.set_up(request(plugin, source("Memory", 1 << 20)))
    assert info.value.code == "ENOMEM"
    assert info.value.error_class is ErrorClass.FINAL
    assert janitor.leftovers() == ([], [])


# ------------------------------------------------------------- path safety


@pytest.mark.parametrize("uid", ["..", "../../etc", "/etc", "a/b", "", "nul\0"])
async def test_unsafe_pod_uids_and_names_are_refused_before_any_change(
    plugin: EmptyDirPlugin, layout: RootLayout, outside: Path, uid: str
) -> None:
    for bad in (
        VolumeRequest(volume_id="v", source=source(), pod_uid=uid, volume_name="cache"),
        VolumeRequest(volume_id="v", source=source(), pod_uid=UID, volume_name=uid),
    ):
        with pytest.raises(PluginError) as info:
            await plugin.set_up(bad)
        assert info.value.code == "UnsafePath"
        assert info.value.error_class is ErrorClass.TRANSIENT
        with pytest.raises(PluginError):
            await plugin.tear_down(bad)
    assert not layout.pods_dir.exists()


async def test_a_mount_path_that_is_not_the_plugins_own_is_refused(
    plugin: EmptyDirPlugin, outside: Path
) -> None:
    req = VolumeRequest(
        volume_id="v", source=source(), pod_uid=UID, volume_name="cache", mount_path=outside
    )
    with pytest.raises(PluginError) as info:
        await plugin.set_up(req)
    assert info.value.code == "InvalidArgument"
    assert info.value.error_class is ErrorClass.TRANSIENT


LEVELS = {
    "pod": ("pods/{uid}", ""),
    "volumes": ("pods/{uid}/volumes", "volumes"),
    "plugin dir": ("pods/{uid}/volumes/" + ED, ED),
}


@pytest.mark.parametrize("level", sorted(LEVELS))
@pytest.mark.parametrize("medium", ["", "Memory"])
async def test_symlinks_planted_on_the_way_reject_set_up_and_tear_down(
    plugin: EmptyDirPlugin,
    layout: RootLayout,
    outside: Path,
    janitor: Janitor,
    level: str,
    medium: str,
) -> None:
    where, target = LEVELS[level]
    link = layout.root / where.format(uid=UID)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside / target if target else outside)
    req = request(plugin, source(medium, 1 << 20))
    with pytest.raises(PluginError) as info:
        await plugin.set_up(req)
    assert info.value.code == "UnsafePath"
    assert info.value.error_class is ErrorClass.TRANSIENT
    with pytest.raises(PluginError) as teardown:
        await plugin.tear_down(req)
    assert teardown.value.code == "UnsafePath"
    assert link.is_symlink()
    assert janitor.leftovers() == ([], [])


async def test_a_symlink_planted_as_the_volume_dir_is_refused_and_removed_as_a_link(
    plugin: EmptyDirPlugin, layout: RootLayout, outside: Path, janitor: Janitor
) -> None:
    volume = layout.pod_volume_dir(UID, ED, "vol")
    volume.parent.mkdir(parents=True)
    volume.symlink_to(outside / "vol")
    req = request(plugin, source("Memory", 1 << 20), name="vol")
    with pytest.raises(PluginError) as info:
        await plugin.set_up(req)
    assert info.value.code == "UnsafePath"
    assert janitor.leftovers() == ([], [])
    await plugin.tear_down(req)
    assert not os.path.lexists(volume)
    assert (outside / "vol" / "precious.txt").exists()
