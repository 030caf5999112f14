"""Removing directories only: every file, link, socket, fifo and mount stays, and is reported."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest

from tests.paths.nodekit import Janitor, snapshot
from volfsm.node import mounts
from volfsm.node.dirsonly import A_MOUNT_POINT, SHOWN, first_kept, remove_dirs, remove_pod_dir
from volfsm.node.layout import PathInUseError, RootLayout

ED = "kubernetes.io~empty-dir"


def kept_of(result: object) -> dict[str, str]:
    return {os.fspath(k.path): k.what for k in result.kept}  # type: ignore[attr-defined]


def test_files_links_sockets_and_fifos_stay_and_empty_dirs_go(
    layout: RootLayout, outside: Path
) -> None:
    # Arrange: empty dirs; files, a link out of the root, a socket, a device, a fifo at depths
    top = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    for rel in ("empty/a/b", "deep/x/y/z", "links", "special/s"):
        (top / rel).mkdir(parents=True)
    (top / "deep/x/y/z/data.bin").write_bytes(b"\x00data\xff")
    (top / "top.txt").write_text("at the top")
    (top / "links/out").symlink_to(outside / "etc")
    os.mknod(top / "special/s/sock", stat.S_IFSOCK | 0o600)
    os.mknod(top / "special/null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    os.mkfifo(top / "special/fifo")
    before = {p: snapshot(top)[p] for p in ("deep/x/y/z/data.bin", "top.txt", "links/out")}

    # Act
    result = remove_dirs(layout, top)

    # Assert: each non-directory kept, said what it is; only empty dirs removed
    assert kept_of(result) == {
        f"{top}/deep/x/y/z/data.bin": "a file",
        f"{top}/top.txt": "a file",
        f"{top}/links/out": "a symlink",
        f"{top}/special/s/sock": "a socket",
        f"{top}/special/fifo": "a fifo",
        f"{top}/special/null": "a device node",
    }
    assert (result.existed, result.gone, result.kept_count, result.removed) == (True, False, 6, 3)
    assert {p: snapshot(top)[p] for p in before} == before
    assert not (top / "empty").exists()
    assert (top / "deep/x/y/z").is_dir() and (top / "special/s").is_dir()
    assert result.lines(" volfsm did not create")[0].startswith(f"kept: {top}/")
    assert "a file volfsm did not create" in result.summary(" volfsm did not create")


@pytest.mark.parametrize("kind", ["tmpfs", "bind mount"])
def test_a_mount_in_the_tree_is_not_entered(
    layout: RootLayout, janitor: Janitor, tmp_path: Path, kind: str
) -> None:
    # Arrange: a mount inside the tree, holding a file and an empty dir of its own
    top = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    inner = top / "sub/mnt"
    inner.mkdir(parents=True)
    (top / "gone/too").mkdir(parents=True)
    if kind == "tmpfs":
        mounts.mount_tmpfs(inner, 1 << 20)
        source = inner
    else:  # same filesystem, another mount: st_dev alone would not tell
        source = tmp_path / "bind-source"
        source.mkdir()
        mounts.bind_mount(source, inner)
    (source / "data").write_text("on the mount")
    (source / "empty-on-the-mount").mkdir()

    # Act
    result = remove_dirs(layout, top)

    # Assert: the mount point is kept and not entered; the rest of the empty dirs went
    assert kept_of(result) == {os.fspath(inner): A_MOUNT_POINT}
    assert not result.kept[0].foreign
    assert mounts.find_mount(inner) is not None
    assert (source / "data").read_text() == "on the mount"
    assert (source / "empty-on-the-mount").is_dir()
    assert not (top / "gone").exists()


def test_a_tree_that_is_itself_a_mount_point_is_kept_whole(
    layout: RootLayout, janitor: Janitor
) -> None:
    top = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    mounts.mount_tmpfs(top, 1 << 20)
    (top / "empty").mkdir()
    result = remove_dirs(layout, top)
    assert kept_of(result) == {os.fspath(top): A_MOUNT_POINT}
    assert (top / "empty").is_dir()


def test_first_kept_looks_into_a_tmpfs_at_the_top(layout: RootLayout, janitor: Janitor) -> None:
    top = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    mounts.mount_tmpfs(top, 1 << 20)
    (top / "a/b").mkdir(parents=True)
    assert first_kept(layout, top) is None  # only directories: nothing would be kept
    (top / "a/b/file").write_text("x")
    found = first_kept(layout, top)
    assert found is not None and (found.path, found.what) == (top / "a/b/file", "a file")
    assert (top / "a/b/file").exists()
    assert first_kept(layout, top / "missing") is None


def test_a_file_or_link_at_the_path_itself_is_kept(layout: RootLayout, outside: Path) -> None:
    plugin_dir = layout.ensure_dir(layout.pod_volumes_dir("u"))
    (plugin_dir / "file").write_text("x")
    (plugin_dir / "link").symlink_to(outside)
    assert kept_of(remove_dirs(layout, plugin_dir / "file")) == {f"{plugin_dir}/file": "a file"}
    assert kept_of(remove_dirs(layout, plugin_dir / "link")) == {f"{plugin_dir}/link": "a symlink"}
    assert (plugin_dir / "file").exists() and (plugin_dir / "link").is_symlink()
    missing = remove_dirs(layout, plugin_dir / "nothing")
    assert (missing.existed, missing.gone) == (False, True)


def test_nesting_deeper_than_the_fd_limit_is_walked(layout: RootLayout) -> None:
    top = layout.ensure_dir(layout.pod_volume_dir("u", ED, "deep"))
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1100):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    try:
        result = remove_dirs(layout, top)
        assert result.kept_count == 1 and result.kept[0].path.name == "leaf"
        assert result.removed == 0 and (top / "d").is_dir()
        unlink_deep_leaf(top, depth=1100)
        again = remove_dirs(layout, top)
        assert (again.gone, again.removed) == (True, 1101) and not top.exists()
    finally:
        remove_deep_tree(top, depth=1100)  # a failed run must not leave what pytest cannot remove


def remove_deep_tree(top: Path, depth: int) -> None:
    """Remove what is left of top/d/d/.../leaf, deepest first, without recursion or long paths."""
    if not top.exists():
        return
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        for _ in range(depth):
            try:
                fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
            except FileNotFoundError:
                break
        with contextlib.suppress(FileNotFoundError):
            os.unlink("leaf", dir_fd=fds[-1])
        while len(fds) > 1:
            os.close(fds.pop())
            with contextlib.suppress(FileNotFoundError):
                os.rmdir("d", dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)


def unlink_deep_leaf(top: Path, depth: int) -> None:
    """Remove top/d/d/.../leaf (a path longer than PATH_MAX) one directory fd at a time."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.unlink("leaf", dir_fd=fd)
    finally:
        os.close(fd)


def test_many_kept_things_are_counted_and_the_first_listed(layout: RootLayout) -> None:
    top = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    for i in range(SHOWN + 5):
        (top / f"f{i}").write_text("x")
    result = remove_dirs(layout, top)
    assert (result.kept_count, len(result.kept)) == (SHOWN + 5, SHOWN)
    assert result.lines()[-1] == "and 5 more kept"
    assert result.summary().endswith(f"({SHOWN + 5} kept in all)")


def test_remove_pod_dir_keeps_what_the_pod_left_and_removes_the_empty_dirs(
    layout: RootLayout,
) -> None:
    pod = layout.pod_dir("u")
    for rel in ("volumes/kubernetes.io~csi", "plugins/x/y", "containers/c1"):
        layout.ensure_dir(pod / rel)
    (pod / "etc-hosts").write_text("127.0.0.1 localhost\n")
    (pod / "containers/c1/0.log").write_bytes(b"log line\n")
    result = remove_pod_dir(layout, "u")
    assert kept_of(result) == {f"{pod}/etc-hosts": "a file", f"{pod}/containers/c1/0.log": "a file"}
    assert not (pod / "volumes").exists() and not (pod / "plugins").exists()
    assert (pod / "etc-hosts").read_text() == "127.0.0.1 localhost\n"
    (pod / "etc-hosts").unlink()
    (pod / "containers/c1/0.log").unlink()
    assert remove_pod_dir(layout, "u").gone and not pod.exists()


def test_remove_pod_dir_refuses_while_anything_is_mounted_under_it(
    layout: RootLayout, janitor: Janitor
) -> None:
    volume = layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    mounts.mount_tmpfs(volume, 1 << 20)
    layout.ensure_dir(layout.pod_dir("u") / "containers")
    with pytest.raises(PathInUseError, match="still mounted") as info:
        remove_pod_dir(layout, "u")
    assert [m.mount_point for m in info.value.mounts] == [os.fspath(volume)]
    assert (layout.pod_dir("u") / "containers").is_dir()


@pytest.mark.parametrize(
    "leftover", ["volumes/kubernetes.io~csi/pv/vol_data.json", "volumeDevices/kubernetes.io~csi/pv"]
)
def test_remove_pod_dir_keeps_a_file_left_in_a_volume_dir(
    layout: RootLayout, leftover: str
) -> None:
    path = layout.pod_dir("u") / leftover
    layout.ensure_dir(path.parent)
    path.write_text("{}")
    result = remove_pod_dir(layout, "u")
    assert kept_of(result) == {os.fspath(path): "a file"}
    assert path.read_text() == "{}"
