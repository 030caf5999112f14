"""How much of the disk a directory tree uses: the kubelet's `fs.DiskUsage` walk, bounded.

Kubelet (`pkg/volume/util/fs/fs.go`, used by emptyDir's MetricsDu) asks
the project quota first (LocalStorageCapacityIsolationFSQuotaMonitoring,
beta and off by default) and otherwise walks the tree: every entry is
lstat-ed (symlinks are counted as themselves, never followed), a directory
on another device is skipped with what is under it, an entry with more
than one link is counted once, an entry that vanished during the walk is
ignored, and the bytes are the allocated blocks x 512 (what `du` says, not
the apparent size). volfsm does the same walk, with two bounds the
kubelet's has not: a time limit and a number of entries. A walk that hits
either stops and says so (`complete` False); what it counted so far is a
lower bound.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass

BLOCK_BYTES = 512
"""st_blocks is in 512-byte units."""


@dataclass(frozen=True, slots=True)
class DirUsage:
    """What a walk found: bytes on disk and entries (inodes), and whether it saw everything."""

    bytes_used: int
    inodes_used: int
    complete: bool


def disk_usage(path: str, time_limit_s: float, max_entries: int) -> DirUsage:
    """The disk usage of the tree at `path` (see the module doc).

    Raises OSError if `path` itself cannot be read; errors below it other
    than a vanished entry stop the walk as incomplete.
    """
    top = os.lstat(path)
    if not stat.S_ISDIR(top.st_mode):
        raise NotADirectoryError(path)
    deadline = time.monotonic() + time_limit_s
    seen_links: set[int] = set()
    used, entries = top.st_blocks * BLOCK_BYTES, 1
    pending = [path]
    while pending:
        if entries >= max_entries or time.monotonic() > deadline:
            return DirUsage(used, entries, complete=False)
        current = pending.pop()
        try:
            with os.scandir(current) as listing:
                for entry in listing:
                    found = _lstat(entry)
                    if found is None or found.st_dev != top.st_dev:
                        continue  # vanished, or another filesystem mounted inside
                    if found.st_nlink > 1 and not stat.S_ISDIR(found.st_mode):
                        if found.st_ino in seen_links:
                            continue
                        seen_links.add(found.st_ino)
                    used += found.st_blocks * BLOCK_BYTES
                    entries += 1
                    if stat.S_ISDIR(found.st_mode):
                        pending.append(entry.path)
        except FileNotFoundError:
            continue  # a directory removed while the walk went on
        except OSError:
            return DirUsage(used, entries, complete=False)
    return DirUsage(used, entries, complete=True)


def _lstat(entry: os.DirEntry[str]) -> os.stat_result | None:
    try:
        return entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None
