"""Removing dirs inside the root: links removed as links, no mount crossed, busy pod dirs kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.paths.nodekit import Janitor
from volfsm.node import mounts
from volfsm.node.layout import PathInUseError, RootLayout, UnsafePathError

ED = "kubernetes.io~empty-dir"


def fill_with_hostile_content(top: Path, outside: Path) -> None:
    """What a pod might leave: files, nested dirs, links out of the root, a hard link, a fifo."""
    (top / "a" / "b" / "c").mkdir(parents=True)
    (top / "a" / "file").write_text("x")
    (top / "a" / "b" / "c" / "deep").write_text("y")
    (top / "link-to-file").symlink_to(outside / "precious.txt")
    (top / "link-to-dir").symlink_to(outside / "etc")
    (top / "a" / "b" / "link-to-root").symlink_to("/")
    (top / "dangling").symlink_to(outside / "does-not-exist")
    os.link(outside / "etc" / "passwd", top / "hardlink")
    os.mkfifo(top / "fifo")


def test_remove_tree_removes_everything_and_nothing_outside(
    layout: RootLayout, outside: Path
) -> None:
    volume = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    fill_with_hostile_content(volume, outside)
    assert layout.remove_tree(volume) is True
    assert not volume.exists()
    assert layout.pod_volumes_dir("u").joinpath(ED).is_dir()
    assert layout.remove_tree(volume) is False


def test_remove_tree_copes_with_nesting_deeper_than_recursion(layout: RootLayout) -> None:
    top = layout.ensure_dir(layout.pod_volume_dir("u", ED, "deep"))
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1100):  # deeper than the recursion limit; path longer than PATH_MAX
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    assert layout.remove_tree(top) is True
    assert not top.exists()


def test_remove_tree_refuses_a_mount_underneath_and_removes_nothing(
    layout: RootLayout, janitor: Janitor
) -> None:
    volume = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    (volume / "keep").write_text("data")
    inner = volume / "mnt"
    inner.mkdir()
    mounts.mount_tmpfs(inner, 1 << 20)
    (inner / "inside-the-mount").write_text("other filesystem")
    with pytest.raises(PathInUseError) as info:
        layout.remove_tree(volume)
    assert [m.mount_point for m in info.value.mounts] == [os.fspath(inner)]
    assert (volume / "keep").read_text() == "data"
    assert (inner / "inside-the-mount").exists()


def test_remove_tree_refuses_when_the_dir_itself_is_mounted(
    layout: RootLayout, janitor: Janitor
) -> None:
    volume = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    mounts.mount_tmpfs(volume, 1 << 20)
    (volume / "data").write_text("tmpfs content")
    with pytest.raises(PathInUseError):
        layout.remove_tree(volume)
    with pytest.raises(PathInUseError, match="mount point"):
        layout.remove_dir(volume)
    assert (volume / "data").exists()


def test_remove_dir_removes_only_empty_dirs_and_empty_parents_below_stop_at(
    layout: RootLayout,
) -> None:
    publish = layout.ensure_dir(layout.csi_publish_path("u", "pv"))
    assert layout.remove_dir(publish, stop_at=layout.pod_volumes_dir("u")) is True
    assert not layout.csi_publish_dir("u", "pv").exists()
    assert not layout.pod_volumes_dir("u").joinpath("kubernetes.io~csi").exists()
    assert layout.pod_volumes_dir("u").is_dir()
    assert layout.remove_dir(publish) is False


def test_remove_dir_stops_at_a_non_empty_parent(layout: RootLayout) -> None:
    publish = layout.ensure_dir(layout.csi_publish_path("u", "pv"))
    layout.csi_vol_data_path("u", "pv").write_text("{}")
    assert layout.remove_dir(publish, stop_at=layout.pod_dir("u")) is True
    assert layout.csi_vol_data_path("u", "pv").exists()


def test_remove_dir_refuses_a_non_empty_dir(layout: RootLayout) -> None:
    volume = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    (volume / "f").write_text("x")
    with pytest.raises(PathInUseError, match="not empty"):
        layout.remove_dir(volume)
    assert (volume / "f").exists()


def test_remove_dir_checks_stop_at_is_a_parent(layout: RootLayout) -> None:
    volume = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    with pytest.raises(UnsafePathError):
        layout.remove_dir(volume, stop_at=layout.pod_dir("other"))
    with pytest.raises(UnsafePathError):
        layout.remove_dir(volume, stop_at=volume)


@pytest.mark.parametrize("kind", ["tmpfs", "bind on the same filesystem"])
def test_a_mount_missed_by_the_precheck_is_still_not_crossed(
    layout: RootLayout, janitor: Janitor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    volume = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    inner = volume / "sub" / "mnt"
    inner.mkdir(parents=True)
    if kind == "tmpfs":
        mounts.mount_tmpfs(inner, 1 << 20)
        (inner / "precious").write_text("other filesystem")
        precious = inner / "precious"
    else:
        source = tmp_path / "bind-source"
        source.mkdir()
        (source / "precious").write_text("bound from elsewhere")
        mounts.bind_mount(source, inner)
        precious = source / "precious"
    # Simulate a mount that appears after the mountinfo check (a race).
    monkeypatch.setattr("volfsm.node.layout.mounts_under", lambda path: [])
    with pytest.raises(PathInUseError, match="not crossing"):
        layout.remove_tree(volume)
    assert precious.exists()
