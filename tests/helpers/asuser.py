"""Writing into a volume as a non-root user in a group (the fsGroup tests)."""

from __future__ import annotations

import os
from pathlib import Path


def run_as_member(path: Path, uid: int, gid: int, file_name: str, dir_name: str) -> None:
    """As `uid` with `gid` as its only supplementary group (primary group = uid), in a
    forked child: create a file and a directory in `path` (opened by root first: the tmp
    dirs above it are root's own). Fails if the child is denied."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.setgroups([gid])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                os.close(os.open(file_name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
                os.mkdir(dir_name, dir_fd=fd)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, f"uid {uid} in group {gid} could not write"
