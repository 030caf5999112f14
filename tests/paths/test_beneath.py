"""`open_dir_beneath`: one openat2 call that follows no symlink and never leaves its dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from volfsm.node import mounts
from volfsm.node.beneath import TMPFS_MAGIC, filesystem_magic, open_dir_beneath


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "file").write_bytes(b"x")
    (tmp_path / "a" / "link").symlink_to(tmp_path / "a" / "b")
    (tmp_path / "outside").mkdir()
    return tmp_path / "a"


def _opened(base: Path, relative: str) -> os.stat_result | None:
    root = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = open_dir_beneath(root, relative)
    finally:
        os.close(root)
    if fd is None:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def test_an_existing_dir_below_is_opened(base: Path) -> None:
    opened = _opened(base, "b")
    assert opened is not None and opened.st_ino == os.stat(base / "b").st_ino


@pytest.mark.parametrize(
    "relative", ["link", "../outside", "b/../../outside", "/tmp", "missing", "file"]
)
def test_a_symlink_an_escape_a_missing_dir_or_a_file_is_not_opened(
    base: Path, relative: str
) -> None:
    assert _opened(base, relative) is None


def test_filesystem_magic_names_a_tmpfs(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.mkdir()
    mounts.mount_tmpfs(target, 1 << 20)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert filesystem_magic(fd) == TMPFS_MAGIC
        finally:
            os.close(fd)
    finally:
        mounts.umount(target)
