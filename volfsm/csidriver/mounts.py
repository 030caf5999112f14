"""Reading /proc/self/mountinfo and mounting, binding and unmounting."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from volfsm.csidriver.cmd import CommandFailed, run, run_or_internal
from volfsm.csidriver.errors import internal

MOUNTINFO = Path("/proc/self/mountinfo")

_MAX_STACKED = 32

_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo."""

    mount_id: int
    parent_id: int
    dev: str
    root: str
    mount_point: str
    options: tuple[str, ...]
    fstype: str
    source: str

    @property
    def readonly(self) -> bool:
        """Whether this mount (not the filesystem) is read-only."""
        return "ro" in self.options


def parse_line(line: str) -> MountEntry:
    """Parse one mountinfo line (fields: id parent dev root point opts ... - type src)."""
    left, _, right = line.rstrip("\n").partition(" - ")
    fields = left.split(" ")
    tail = right.split(" ")
    return MountEntry(
        mount_id=int(fields[0]),
        parent_id=int(fields[1]),
        dev=fields[2],
        root=_unescape(fields[3]),
        mount_point=_unescape(fields[4]),
        options=tuple(fields[5].split(",")),
        fstype=tail[0] if tail else "",
        source=_unescape(tail[1]) if len(tail) > 1 else "",
    )


def read_mountinfo() -> list[MountEntry]:
    """All mounts of this process's mount namespace."""
    with MOUNTINFO.open() as f:
        return [parse_line(line) for line in f if line.strip()]


def canonical(path: str) -> str:
    """The path as mountinfo spells it (symlinks resolved, no trailing slash)."""
    return os.path.realpath(path)


def mounts_at(path: str) -> list[MountEntry]:
    """Mounts whose mount point is this path, bottom first."""
    want = canonical(path)
    return [m for m in read_mountinfo() if m.mount_point == want]


def is_mount_point(path: str) -> bool:
    """Whether anything is mounted at path."""
    return bool(mounts_at(path))


def mounts_of_device(dev_number: str, device: str) -> list[MountEntry]:
    """Mounts of the filesystem on a device, and binds of the device node itself."""
    node_root = "/" + os.path.basename(device)
    return [
        m
        for m in read_mountinfo()
        if m.dev == dev_number or (m.fstype == "devtmpfs" and m.root == node_root)
    ]


def mount(
    device: str, target: str, fstype: str, options: Sequence[str], *, readonly: bool = False
) -> None:
    """Mount a filesystem from device at target; readonly makes this mount (only) read-only."""
    args = ["mount", "-t", fstype]
    if options:
        args += ["-o", ",".join(options)]
    run_or_internal([*args, device, target])
    if readonly:
        _remount_readonly(target)


def bind(source: str, target: str, *, readonly: bool) -> None:
    """Bind-mount source (a directory or a device node) onto target, read-only if asked."""
    run_or_internal(["mount", "--bind", source, target])
    if readonly:
        _remount_readonly(target)


def _remount_readonly(target: str) -> None:
    try:
        run(["mount", "-o", "remount,bind,ro", target])
    except CommandFailed as err:
        umount(target)
        raise internal(f"read-only remount of {target} failed: {err}") from err


def umount(target: str) -> None:
    """Unmount the topmost mount at target."""
    run_or_internal(["umount", target])


def umount_all(target: str) -> int:
    """Unmount every mount stacked at target; return how many were removed."""
    count = 0
    while is_mount_point(target):
        if count >= _MAX_STACKED:
            raise internal(f"{target} is still a mount point after {count} unmounts")
        umount(target)
        count += 1
    return count
