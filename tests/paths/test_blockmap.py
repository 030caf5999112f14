"""Block volume mapping with a real loop device (sparse file + losetup)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.paths.nodekit import Janitor
from volfsm.node import blockmap, mounts
from volfsm.node.blockmap import BlockMapError
from volfsm.node.layout import PathInUseError, RootLayout, UnsafePathError

SPEC = "pv-block"


@pytest.fixture
def device(janitor: Janitor) -> str:
    return janitor.loop_disk()


def paths(layout: RootLayout, uid: str) -> tuple[Path, Path]:
    return layout.csi_block_global_map_path(SPEC), layout.csi_block_pod_device_dir(uid)


def map_pod(layout: RootLayout, device: str, uid: str) -> blockmap.BlockMapResult:
    global_dir, pod_dir = paths(layout, uid)
    return blockmap.map_block_volume(layout, device, global_dir, uid, pod_dir, SPEC)


def unmap_pod(layout: RootLayout, uid: str) -> None:
    global_dir, pod_dir = paths(layout, uid)
    blockmap.unmap_block_volume(layout, global_dir, uid, pod_dir, SPEC)


def sys_loop(device: str, attr: str) -> str:
    return Path(f"/sys/block/{Path(device).name}/{attr}").read_text().strip()


def test_map_binds_the_device_links_it_for_the_pod_and_takes_a_read_only_loop_lock(
    layout: RootLayout, device: str
) -> None:
    result = map_pod(layout, device, "pod-a")
    global_file = layout.csi_block_global_map_path(SPEC) / "pod-a"
    assert result.global_map_path == global_file
    assert result.device_path == device
    # global map path: the device bind-mounted onto a regular file
    assert stat.S_ISBLK(os.stat(global_file).st_mode)
    assert os.stat(global_file).st_rdev == os.stat(device).st_rdev
    bound = mounts.find_mount(global_file)
    assert bound is not None and bound.root == "/" + Path(device).name
    # pod device map path: a symlink to the device
    link = layout.csi_block_pod_device_path("pod-a", SPEC)
    assert result.pod_device_path == link
    assert link.is_symlink() and os.readlink(link) == device
    # the fd lock: a read-only loop device backed by the global map file
    assert sys_loop(result.loop_device, "loop/backing_file") == os.fspath(global_file)
    assert sys_loop(result.loop_device, "ro") == "1"
    assert blockmap.loop_devices_for(global_file) == [result.loop_device]


def test_the_lock_reads_the_same_bytes_as_the_device(layout: RootLayout, device: str) -> None:
    with open(device, "r+b") as fh:
        fh.write(b"volfsm-marker")
    result = map_pod(layout, device, "pod-a")
    with open(result.loop_device, "rb") as fh:
        assert fh.read(13) == b"volfsm-marker"


def test_map_is_idempotent(layout: RootLayout, device: str) -> None:
    first = map_pod(layout, device, "pod-a")
    second = map_pod(layout, device, "pod-a")
    assert first == second
    global_file = first.global_map_path
    assert [m.mount_point for m in mounts.mounts_under(global_file.parent)] == [
        os.fspath(global_file)
    ]
    assert blockmap.loop_devices_for(global_file) == [first.loop_device]


def test_two_pods_are_two_references_and_unmap_releases_only_its_own(
    layout: RootLayout, device: str
) -> None:
    a = map_pod(layout, device, "pod-a")
    b = map_pod(layout, device, "pod-b")
    global_dir = layout.csi_block_global_map_path(SPEC)
    assert blockmap.device_bind_mount_refs(layout, global_dir) == [
        global_dir / "pod-a",
        global_dir / "pod-b",
    ]
    assert a.loop_device != b.loop_device
    unmap_pod(layout, "pod-a")
    assert blockmap.device_bind_mount_refs(layout, global_dir) == [global_dir / "pod-b"]
    assert not os.path.lexists(a.global_map_path)
    assert not os.path.lexists(a.pod_device_path)
    assert blockmap.loop_devices_for(a.global_map_path) == []
    assert os.readlink(b.pod_device_path) == device
    with pytest.raises(PathInUseError, match="pod-b"):
        blockmap.remove_global_map_dir(layout, global_dir)
    unmap_pod(layout, "pod-b")
    assert blockmap.device_bind_mount_refs(layout, global_dir) == []
    assert blockmap.remove_global_map_dir(layout, global_dir) is True
    assert not global_dir.exists()
    assert blockmap.remove_global_map_dir(layout, global_dir) is False


def test_unmap_is_idempotent_and_leaves_no_mount_or_loop(
    layout: RootLayout, device: str, janitor: Janitor
) -> None:
    unmap_pod(layout, "never-mapped")
    result = map_pod(layout, device, "pod-a")
    unmap_pod(layout, "pod-a")
    unmap_pod(layout, "pod-a")
    mounted, loops = janitor.leftovers()
    assert mounted == []
    assert loops == [device] or loops == []  # only the test disk itself (backed under tmp)
    assert blockmap.loop_devices_for(result.global_map_path) == []


def test_unmap_finishes_a_half_done_map(layout: RootLayout, device: str) -> None:
    result = map_pod(layout, device, "pod-a")
    blockmap.detach_lock(result.global_map_path)  # e.g. the process died during unmap
    os.unlink(result.pod_device_path)
    unmap_pod(layout, "pod-a")
    assert not os.path.lexists(result.global_map_path)
    assert not mounts.mounts_under(layout.root)


def test_device_opened_sees_a_mounted_filesystem(
    layout: RootLayout, device: str, tmp_path: Path, janitor: Janitor
) -> None:
    assert blockmap.device_opened(device) is False
    subprocess.run(["mkfs.ext4", "-q", "-F", device], check=True, capture_output=True)
    target = tmp_path / "fs"
    target.mkdir()
    mounts.mount(device, target, "ext4")
    assert blockmap.device_opened(device) is True
    mounts.umount(target)
    assert blockmap.device_opened(device) is False
    assert blockmap.device_opened(os.fspath(tmp_path / "missing")) is False
    assert blockmap.device_opened("/etc/hostname") is False


def test_map_refuses_to_replace_a_mapped_device_with_another(
    layout: RootLayout, device: str, janitor: Janitor
) -> None:
    other = janitor.loop_disk("other.img")
    map_pod(layout, device, "pod-a")
    with pytest.raises(BlockMapError, match="refusing to replace"):
        map_pod(layout, other, "pod-a")
    global_file = layout.csi_block_global_map_path(SPEC) / "pod-a"
    assert os.stat(global_file).st_rdev == os.stat(device).st_rdev


def test_map_refuses_what_is_not_a_block_device(layout: RootLayout, tmp_path: Path) -> None:
    regular = tmp_path / "not-a-device"
    regular.write_text("x")
    for bad in (os.fspath(regular), "relative/dev", "", os.fspath(tmp_path / "missing")):
        with pytest.raises(BlockMapError):
            map_pod(layout, bad, "pod-a")
    assert not mounts.mounts_under(layout.root)


def test_map_resolves_a_symlinked_device_path(
    layout: RootLayout, device: str, tmp_path: Path
) -> None:
    alias = tmp_path / "by-id-link"
    alias.symlink_to(device)
    result = map_pod(layout, os.fspath(alias), "pod-a")
    assert result.device_path == device
    assert os.readlink(result.pod_device_path) == device


@pytest.mark.parametrize("uid", ["..", "../../etc", "/abs", "a/b", ""])
def test_unsafe_pod_uids_and_names_are_refused(layout: RootLayout, device: str, uid: str) -> None:
    global_dir = layout.csi_block_global_map_path(SPEC)
    pod_dir = layout.csi_block_pod_device_dir("pod-a")
    with pytest.raises(UnsafePathError):
        blockmap.map_block_volume(layout, device, global_dir, uid, pod_dir, SPEC)
    with pytest.raises(UnsafePathError):
        blockmap.map_block_volume(layout, device, global_dir, "pod-a", pod_dir, uid)
    with pytest.raises(UnsafePathError):
        blockmap.unmap_block_volume(layout, global_dir, uid, pod_dir, SPEC)
    assert not mounts.mounts_under(layout.root)


def test_map_dirs_outside_the_root_are_refused(
    layout: RootLayout, device: str, outside: Path
) -> None:
    with pytest.raises(UnsafePathError):
        blockmap.map_block_volume(
            layout, device, outside / "dev", "pod-a", layout.csi_block_pod_device_dir("pod-a"), SPEC
        )
    with pytest.raises(UnsafePathError):
        blockmap.map_block_volume(
            layout, device, layout.csi_block_global_map_path(SPEC), "pod-a", outside, SPEC
        )
    assert not mounts.mounts_under(outside)


@pytest.mark.parametrize("where", ["global dir", "pod device dir", "block dir"])
def test_symlinks_planted_on_the_way_are_refused_and_nothing_outside_is_touched(
    layout: RootLayout, device: str, outside: Path, where: str
) -> None:
    global_dir = layout.csi_block_global_map_path(SPEC)
    pod_dir = layout.csi_block_pod_device_dir("pod-a")
    link = {"global dir": global_dir, "pod device dir": pod_dir, "block dir": global_dir.parent}[
        where
    ]
    layout.ensure_dir(link.parent)
    link.symlink_to(outside if where == "block dir" else outside / "dev")
    with pytest.raises(UnsafePathError):
        blockmap.map_block_volume(layout, device, global_dir, "pod-a", pod_dir, SPEC)
    with pytest.raises(UnsafePathError):
        blockmap.unmap_block_volume(layout, global_dir, "pod-a", pod_dir, SPEC)
    assert link.is_symlink()
    assert not mounts.mounts_under(outside)
    assert not mounts.mounts_under(layout.root)


def test_a_symlink_planted_at_the_pods_own_entries_is_replaced_as_a_link(
    layout: RootLayout, device: str, outside: Path
) -> None:
    global_dir = layout.csi_block_global_map_path(SPEC)
    pod_dir = layout.csi_block_pod_device_dir("pod-a")
    layout.ensure_dir(global_dir)
    layout.ensure_dir(pod_dir)
    (global_dir / "pod-a").symlink_to(outside / "precious.txt")
    (pod_dir / SPEC).symlink_to(outside / "etc" / "passwd")
    result = blockmap.map_block_volume(layout, device, global_dir, "pod-a", pod_dir, SPEC)
    assert stat.S_ISBLK(os.stat(result.global_map_path).st_mode)
    assert os.readlink(result.pod_device_path) == device
    assert not mounts.mounts_under(outside)
    blockmap.unmap_block_volume(layout, global_dir, "pod-a", pod_dir, SPEC)


async def test_async_variants(layout: RootLayout, device: str) -> None:
    global_dir, pod_dir = paths(layout, "pod-a")
    result = await blockmap.map_block_volume_async(
        layout, device, global_dir, "pod-a", pod_dir, SPEC
    )
    assert await blockmap.device_bind_mount_refs_async(layout, global_dir) == [
        result.global_map_path
    ]
    assert await blockmap.device_opened_async(device) is False
    await blockmap.unmap_block_volume_async(layout, global_dir, "pod-a", pod_dir, SPEC)
    assert await blockmap.remove_global_map_dir_async(layout, global_dir) is True


def test_a_device_node_planted_as_the_global_map_file_is_replaced_by_a_real_bind(
    layout: RootLayout, device: str
) -> None:
    global_dir = layout.ensure_dir(layout.csi_block_global_map_path(SPEC))
    os.mknod(global_dir / "pod-a", stat.S_IFBLK | 0o600, os.stat(device).st_rdev)
    result = map_pod(layout, device, "pod-a")
    assert mounts.is_mount_point(result.global_map_path)
    assert blockmap.device_bind_mount_refs(layout, global_dir) == [result.global_map_path]
