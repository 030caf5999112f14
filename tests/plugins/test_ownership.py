"""The fsGroup ownership pass (volfsm.node.ownership) on real trees: the kubelet's
SetVolumeOwnership bits, symlinks not followed, OnRootMismatch, read-only, mounts."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from volfsm.node.ownership import ALWAYS, ON_ROOT_MISMATCH, set_volume_ownership

GROUP = 3456


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def tree(root: Path) -> Path:
    root.mkdir()
    (root / "sub").mkdir(mode=0o700)
    (root / "sub").chmod(0o700)
    (root / "sub" / "private").write_text("x")
    (root / "sub" / "private").chmod(0o600)
    (root / "script").write_text("#!/bin/sh\n")
    (root / "script").chmod(0o4711)
    return root


def test_group_setgid_and_added_bits_as_the_kubelet(tmp_path: Path) -> None:
    root = tree(tmp_path / "vol")
    result = set_volume_ownership(root, GROUP, ALWAYS)
    assert result.walked and result.entries == 4 and result.errors == 0
    for path in (root, root / "sub", root / "sub" / "private", root / "script"):
        assert path.lstat().st_gid == GROUP
        assert path.lstat().st_uid == 0  # the owner stays
    assert mode(root / "sub") == 0o700 | 0o070 | stat.S_ISGID  # rw + x for the group, setgid
    assert mode(root / "sub" / "private") == 0o660  # rw for the group, no x
    assert mode(root / "script") == 0o4771  # bits only added: setuid and o+x stay
    assert "4 entries walked, 4 chowned, 4 chmodded" in result.summary()


def test_symlinks_are_chowned_themselves_and_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x")
    (outside / "secret").chmod(0o600)
    root = tmp_path / "vol"
    root.mkdir()
    (root / "to-dir").symlink_to(outside)
    (root / "to-file").symlink_to(outside / "secret")
    set_volume_ownership(root, GROUP)
    assert (root / "to-dir").lstat().st_gid == GROUP
    assert (root / "to-file").lstat().st_gid == GROUP
    assert outside.stat().st_gid == 0 and (outside / "secret").stat().st_gid == 0
    assert mode(outside / "secret") == 0o600


def test_read_only_adds_only_read_bits(tmp_path: Path) -> None:
    root = tree(tmp_path / "vol")
    set_volume_ownership(root, GROUP, read_only=True)
    assert mode(root / "sub" / "private") == 0o640
    assert mode(root / "sub") == 0o750 | stat.S_ISGID


def test_on_root_mismatch_skips_a_matching_root_and_walks_otherwise(tmp_path: Path) -> None:
    root = tree(tmp_path / "vol")
    first = set_volume_ownership(root, GROUP, ON_ROOT_MISMATCH)
    assert first.walked and first.chowned == 4
    (root / "late").write_text("x")  # root still matches: the pass does not look inside
    (root / "late").chmod(0o644)
    second = set_volume_ownership(root, GROUP, ON_ROOT_MISMATCH)
    assert not second.walked and second.entries == 0
    assert "root already matches" in second.summary()
    assert mode(root / "late") == 0o644
    always = set_volume_ownership(root, GROUP, ALWAYS)
    assert always.walked and always.chmodded == 1  # only the new file needed a change
    assert mode(root / "late") == 0o664
    root.chmod(0o755)  # the root lost setgid and group rw: a mismatch again
    third = set_volume_ownership(root, GROUP, ON_ROOT_MISMATCH)
    assert third.walked and mode(root) == 0o775 | stat.S_ISGID


def test_no_fs_group_changes_nothing(tmp_path: Path) -> None:
    root = tree(tmp_path / "vol")
    result = set_volume_ownership(root, None)
    assert not result.walked and result.summary() == ""
    assert mode(root / "sub") == 0o700 and (root / "sub").stat().st_gid == 0


def test_a_filesystem_mounted_inside_is_not_entered(tmp_path: Path) -> None:
    root = tree(tmp_path / "vol")
    inner = root / "mnt"
    inner.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(inner)], check=True)
    try:
        (inner / "theirs").write_text("x")
        set_volume_ownership(root, GROUP)
        assert (inner / "theirs").stat().st_gid == 0
        assert (root / "script").stat().st_gid == GROUP
    finally:
        subprocess.run(["umount", str(inner)], check=True)


def test_a_started_dir_fd_is_walked(tmp_path: Path) -> None:
    root = tree(tmp_path / "vol")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        result = set_volume_ownership(Path("shown"), GROUP, dir_fd=fd)
    finally:
        os.close(fd)
    assert result.entries == 4 and (root / "sub" / "private").stat().st_gid == GROUP
