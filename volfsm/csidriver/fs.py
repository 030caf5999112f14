"""The ext4 filesystem on a volume: probe, format, grow, usage."""

from __future__ import annotations

import os
from dataclasses import dataclass

from volfsm.csidriver.cmd import CommandFailed, run, run_or_internal
from volfsm.csidriver.errors import failed_precondition, internal

SUPPORTED_FS = "ext4"


def probe_type(device: str) -> str | None:
    """The filesystem type found on device, or None when it holds none."""
    try:
        proc = run(["blkid", "-p", "-s", "TYPE", "-o", "value", device], ok_codes=(0, 2))
    except CommandFailed as err:
        raise internal(str(err)) from err
    fstype = proc.stdout.strip()
    return fstype or None


def format_ext4(device: str) -> None:
    """Make an ext4 filesystem on device (only ever called on a blank device)."""
    run_or_internal(
        ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", device]
    )


def ensure_ext4(device: str) -> bool:
    """Format device with ext4 if it holds no filesystem; return True if formatted."""
    found = probe_type(device)
    if found is None:
        format_ext4(device)
        return True
    if found != SUPPORTED_FS:
        raise failed_precondition(f"{device} already holds a {found} filesystem, not ext4")
    return False


def size_bytes(device: str) -> int:
    """Size of the ext4 filesystem on device (block count times block size)."""
    out = run_or_internal(["dumpe2fs", "-h", device])
    fields: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        return int(fields["Block count"]) * int(fields["Block size"])
    except (KeyError, ValueError) as err:
        raise internal(f"cannot read the filesystem size of {device}") from err


def grow_online(device: str) -> None:
    """Grow the mounted filesystem on device to fill it (needs CAP_SYS_RESOURCE)."""
    run(["resize2fs", device])


def grow_offline(device: str) -> None:
    """Check and grow the unmounted filesystem on device to fill it."""
    # e2fsck exits 1 when it fixed something, which is fine before a resize.
    run_or_internal(["e2fsck", "-f", "-p", device], ok_codes=(0, 1))
    run_or_internal(["resize2fs", device])


@dataclass(frozen=True)
class Usage:
    """Bytes and inodes of a mounted filesystem."""

    bytes_total: int
    bytes_available: int
    bytes_used: int
    inodes_total: int
    inodes_available: int
    inodes_used: int


def usage(path: str) -> Usage:
    """statvfs of the filesystem mounted at path."""
    st = os.statvfs(path)
    return Usage(
        bytes_total=st.f_blocks * st.f_frsize,
        bytes_available=st.f_bavail * st.f_frsize,
        bytes_used=(st.f_blocks - st.f_bfree) * st.f_frsize,
        inodes_total=st.f_files,
        inodes_available=st.f_favail,
        inodes_used=st.f_files - st.f_ffree,
    )
