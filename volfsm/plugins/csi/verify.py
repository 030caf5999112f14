"""Checking what a driver's "OK" left on the node (reference §4.8).

Drivers report success without proof. After NodeStage / NodePublish
returned OK the plugin looks at /proc/self/mountinfo (and at the path
itself) and records what it found in `MountResult.mount_found` / `.detail`
instead of trusting the driver. Nothing here raises: findings are data.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from volfsm.node.mounts import MountInfo, find_mount
from volfsm.plugins.base import MountResult

MOUNT = "mount"
"""A filesystem is expected to be mounted at the path."""
DEVICE = "device"
"""A block device file is expected at the path (usually a bind mount of the device)."""
ANYTHING = "anything"
"""Nothing in particular is expected (block staging: drivers differ)."""


@dataclass(frozen=True)
class Expected:
    """What a successful call should have left at `path`."""

    path: Path
    kind: str = MOUNT
    read_only: bool = False
    fs_type: str = ""
    same_device_as: Path | None = None
    """A path whose mount must be the same filesystem (publish binds the staged one)."""
    mount_group: int | None = None
    """The group the mount's root must belong to (volume_mount_group was sent)."""


def _describe(info: MountInfo) -> str:
    return f"{info.fstype} {info.source} root={info.root} dev={info.major}:{info.minor}"


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def check(expected: Expected) -> MountResult:
    """What is at `expected.path` now, and where it differs from what was expected."""
    path = expected.path
    st = _lstat(path)
    problems: list[str] = []
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        problems.append(f"{path} is a symlink (to {target!r}); not followed")
    info = find_mount(path)
    if info is None:
        found: bool | None = False
        if expected.kind == MOUNT:
            problems.insert(0, "driver reported success but nothing is mounted there")
            detail = ""
        elif expected.kind == DEVICE:
            if st is not None and stat.S_ISBLK(st.st_mode):
                detail = f"block device node {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
            else:
                problems.insert(0, "driver reported success but there is no block device there")
                detail = ""
        else:
            found = None
            detail = "no mount (none expected)"
    else:
        found = True
        detail = _describe(info)
        problems += _mount_problems(expected, info)
    if problems:
        logger.warning("{}: {}", path, "; ".join(problems))
    return MountResult(
        path=str(path),
        mount_found=found,
        detail="; ".join(p for p in (detail, *problems) if p),
    )


def _mount_problems(expected: Expected, info: MountInfo) -> list[str]:
    problems = []
    path = expected.path
    if expected.kind == DEVICE:
        try:
            is_block = stat.S_ISBLK(os.stat(path).st_mode)
        except OSError:
            is_block = False
        if not is_block:
            problems.append("mounted, but not a block device")
    if expected.read_only and not info.read_only:
        problems.append("read-only was requested but the mount is read-write")
    if expected.fs_type and expected.kind == MOUNT and info.fstype != expected.fs_type:
        problems.append(f"fs_type {expected.fs_type} was requested but {info.fstype} is mounted")
    if expected.same_device_as is not None:
        staged = find_mount(expected.same_device_as)
        if staged is not None and (staged.major, staged.minor) != (info.major, info.minor):
            problems.append(
                f"not the staged filesystem (staging has {staged.major}:{staged.minor})"
            )
    if expected.mount_group is not None:
        try:
            gid = os.stat(path).st_gid
        except OSError:
            gid = -1
        if gid != expected.mount_group:
            problems.append(f"volume_mount_group {expected.mount_group} was sent but gid is {gid}")
    return problems


def still_mounted(path: Path) -> MountInfo | None:
    """The mount still at `path` after the driver said it removed it, if any."""
    return find_mount(path)
