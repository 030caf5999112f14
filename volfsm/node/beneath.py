"""Two Linux calls Python does not wrap: `openat2` (below) and `fstatfs` (`filesystem_magic`).

Open a directory below another in one system call, following no symlink (`openat2`).

`RootLayout`'s walk opens each component of a path with `O_NOFOLLOW` to be
sure no symlink is followed: two system calls per component, and each one a
chance for another thread to take the GIL. Linux 5.6+ does the same check
in one call: `openat2` with `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH` fails
(ELOOP, EXDEV) on any symlink or `..` on the way. `open_dir_beneath` is that
call, for paths that exist; None when it cannot say (no `openat2`, a missing
component, a symlink or anything else): the caller then walks as before,
which also gives the error its precise reason.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
from functools import cache

SYS_OPENAT2 = 437
"""Its number in the unified syscall table of x86-64 and arm64 (`_ARCHES`)."""
_ARCHES = ("x86_64", "aarch64", "arm64")
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@cache
def _syscall() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if platform.system() != "Linux" or platform.machine() not in _ARCHES:
        return None
    call = _libc().syscall
    call.restype = ctypes.c_long
    return call


_unsupported = False


def open_dir_beneath(dir_fd: int, relative: str) -> int | None:
    """An fd of the directory `relative` below `dir_fd`, no symlink followed, no `..` out.

    None if `openat2` is missing or refuses (the path is missing, holds a
    symlink, or anything else): walk instead.
    """
    global _unsupported
    call = _syscall()
    if call is None or _unsupported:
        return None
    how = _OpenHow(_FLAGS, 0, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)
    fd = call(SYS_OPENAT2, dir_fd, os.fsencode(relative), ctypes.byref(how), ctypes.sizeof(how))
    if fd >= 0:
        return int(fd)
    if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter
        _unsupported = True
    return None


TMPFS_MAGIC = 0x01021994
_STATFS_BYTES = 256
"""Room for `struct statfs` (120 bytes on 64-bit Linux); its first field is `f_type`."""


def filesystem_magic(fd: int) -> int | None:
    """The `f_type` of the filesystem holding the file open at `fd` (`fstatfs`); None if the
    call is not there or fails. `TMPFS_MAGIC` for a tmpfs."""
    call = _syscall()
    if call is None or ctypes.sizeof(ctypes.c_long) != 8:
        return None
    buf = ctypes.create_string_buffer(_STATFS_BYTES)
    libc = _libc()
    if libc.fstatfs(fd, buf) != 0:
        return None
    return int(ctypes.c_long.from_buffer(buf).value)
