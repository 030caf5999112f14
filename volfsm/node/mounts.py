"""Mount helpers: /proc/self/mountinfo parsing, mount, bind, umount, tmpfs.

Mounting is done with the mount(2)/umount2(2) system calls through ctypes,
not the mount(8)/umount(8) commands, because:

* a target may be given as ``/proc/self/fd/N`` (see `RootLayout.pin`): the
  kernel mounts onto exactly the directory that was opened without
  following symlinks, while mount(8) would canonicalise the name and
  resolve symlinks again;
* ``umount2(..., UMOUNT_NOFOLLOW)`` refuses to follow a symlink at the target;
* the errno comes back as is (EBUSY, EINVAL, ENOENT, EPERM), which the
  plugins use to classify errors, and no process is forked per call.

Options are split like mount(8) does: flag options (ro, nosuid, noexec, ...)
become MS_* flags, propagation options (private, shared, ...) are applied
with a second call, everything else goes to the filesystem as data.
Loop setup ("loop") and userspace options are not supported here.

Every call blocks; the ``*_async`` variants run it in a worker thread for
the asyncio engine.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from volfsm.errors import VolfsmError

MOUNTINFO = Path("/proc/self/mountinfo")
_PROC_FD = "/proc/self/fd/"

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_SYNCHRONOUS = 16
MS_REMOUNT = 32
MS_MANDLOCK = 64
MS_DIRSYNC = 128
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_SILENT = 32768
MS_UNBINDABLE = 1 << 17
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MS_LAZYTIME = 1 << 25

MNT_FORCE = 1
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8

# option -> (flag, set?) ; "set" False clears the flag (e.g. "rw", "exec").
_FLAG_OPTIONS: dict[str, tuple[int, bool]] = {
    "defaults": (0, True),
    "ro": (MS_RDONLY, True),
    "rw": (MS_RDONLY, False),
    "nosuid": (MS_NOSUID, True),
    "suid": (MS_NOSUID, False),
    "nodev": (MS_NODEV, True),
    "dev": (MS_NODEV, False),
    "noexec": (MS_NOEXEC, True),
    "exec": (MS_NOEXEC, False),
    "sync": (MS_SYNCHRONOUS, True),
    "async": (MS_SYNCHRONOUS, False),
    "dirsync": (MS_DIRSYNC, True),
    "mand": (MS_MANDLOCK, True),
    "nomand": (MS_MANDLOCK, False),
    "noatime": (MS_NOATIME, True),
    "atime": (MS_NOATIME, False),
    "nodiratime": (MS_NODIRATIME, True),
    "diratime": (MS_NODIRATIME, False),
    "relatime": (MS_RELATIME, True),
    "norelatime": (MS_RELATIME, False),
    "strictatime": (MS_STRICTATIME, True),
    "lazytime": (MS_LAZYTIME, True),
    "nolazytime": (MS_LAZYTIME, False),
    "silent": (MS_SILENT, True),
    "loud": (MS_SILENT, False),
    "remount": (MS_REMOUNT, True),
    "bind": (MS_BIND, True),
    "rbind": (MS_BIND | MS_REC, True),
}
_PROPAGATION_OPTIONS: dict[str, int] = {
    "private": MS_PRIVATE,
    "rprivate": MS_PRIVATE | MS_REC,
    "shared": MS_SHARED,
    "rshared": MS_SHARED | MS_REC,
    "slave": MS_SLAVE,
    "rslave": MS_SLAVE | MS_REC,
    "unbindable": MS_UNBINDABLE,
    "runbindable": MS_UNBINDABLE | MS_REC,
}
_UNSUPPORTED_OPTIONS = frozenset({"loop", "user", "users", "owner", "group", "auto", "noauto"})


class MountError(VolfsmError):
    """A mount helper failed. `code` is the errno name (e.g. "EBUSY") or a short word."""

    def __init__(self, op: str, target: str, code: str, message: str, err: int = 0) -> None:
        super().__init__(f"{op} {target}: {code}: {message}")
        self.op = op
        self.target = target
        self.code = code
        self.message = message
        self.errno = err


# ------------------------------------------------------------------ mountinfo


@dataclass(frozen=True, slots=True)
class MountInfo:
    """One line of /proc/self/mountinfo (proc(5)), with octal escapes decoded."""

    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str
    mount_point: str
    mount_options: tuple[str, ...]
    optional_fields: tuple[str, ...]
    fstype: str
    source: str
    super_options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        """Whether this mount (not necessarily the filesystem) is read-only."""
        return "ro" in self.mount_options

    def super_option(self, name: str) -> str | None:
        """A filesystem option's value ("size" -> "1024k"); "" for a bare flag; None if absent."""
        for option in self.super_options:
            key, sep, value = option.partition("=")
            if key == name:
                return value if sep else ""
        return None


_ESCAPE = re.compile(rb"\\([0-7]{3})")


def _unescape(field: bytes) -> str:
    """Decode mountinfo's octal escapes (\\040 space, \\011 tab, \\012 newline, \\134 '\\')."""
    raw = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), field)
    return os.fsdecode(raw)


def parse_mountinfo_line(line: bytes | str) -> MountInfo:
    """Parse one mountinfo line; `ValueError` if it is malformed."""
    raw = line.encode() if isinstance(line, str) else line
    fields = raw.rstrip(b"\n").split(b" ")
    try:
        sep = fields.index(b"-", 6)
    except ValueError:
        raise ValueError(f"mountinfo line without ' - ' separator: {raw!r}") from None
    if len(fields) < sep + 3:
        raise ValueError(f"mountinfo line too short: {raw!r}")
    major, _, minor = fields[2].partition(b":")
    return MountInfo(
        mount_id=int(fields[0]),
        parent_id=int(fields[1]),
        major=int(major),
        minor=int(minor),
        root=_unescape(fields[3]),
        mount_point=_unescape(fields[4]),
        mount_options=tuple(os.fsdecode(fields[5]).split(",")),
        optional_fields=tuple(os.fsdecode(f) for f in fields[6:sep]),
        fstype=_unescape(fields[sep + 1]),
        source=_unescape(fields[sep + 2]),
        super_options=tuple(_unescape(fields[sep + 3]).split(",")) if len(fields) > sep + 3 else (),
    )


def parse_mountinfo(data: bytes | str) -> list[MountInfo]:
    """Parse a whole mountinfo file."""
    raw = data.encode() if isinstance(data, str) else data
    return [parse_mountinfo_line(line) for line in raw.split(b"\n") if line.strip()]


def read_mountinfo(path: Path = MOUNTINFO) -> list[MountInfo]:
    """The current mounts of this process's mount namespace, in mountinfo order."""
    with open(path, "rb") as fh:
        return parse_mountinfo(fh.read())


def _norm(path: str | os.PathLike[str]) -> str:
    """Absolute, lexically normalised; symlinks are NOT resolved (give canonical paths)."""
    return os.path.normpath(os.path.abspath(os.fspath(path)))


def find_mount(path: str | os.PathLike[str]) -> MountInfo | None:
    """The topmost mount whose mount point is exactly `path`, or None."""
    target = _norm(path)
    found = None
    for info in read_mountinfo():
        if info.mount_point == target:
            found = info  # later lines are stacked on top of earlier ones
    return found


def is_mount_point(path: str | os.PathLike[str]) -> bool:
    """Whether something is mounted exactly at `path` (by mountinfo, so bind mounts count)."""
    return find_mount(path) is not None


def mounts_under(
    path: str | os.PathLike[str], infos: Iterable[MountInfo] | None = None
) -> list[MountInfo]:
    """Mounts at or below `path`, in the order to unmount them (deepest and newest first)."""
    target = _norm(path)
    prefix = target.rstrip("/") + "/"
    listed = list(read_mountinfo() if infos is None else infos)
    found = [
        (index, info)
        for index, info in enumerate(listed)
        if info.mount_point == target or info.mount_point.startswith(prefix)
    ]
    found.sort(key=lambda item: (item[1].mount_point.count("/"), item[0]), reverse=True)
    return [info for _, info in found]


# -------------------------------------------------------------- system calls


@cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    libc.mount.restype = ctypes.c_int
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.umount2.restype = ctypes.c_int
    return libc


def _error(op: str, target: str, err: int, detail: str = "") -> MountError:
    code = errno.errorcode.get(err, str(err))
    message = os.strerror(err) + (f" ({detail})" if detail else "")
    return MountError(op, target, code, message, err)


def _sys_mount(source: str, target: str, fstype: str, flags: int, data: str) -> None:
    ok = _libc().mount(
        os.fsencode(source) if source else None,
        os.fsencode(target),
        os.fsencode(fstype) if fstype else None,
        flags,
        os.fsencode(data) if data else None,
    )
    if ok != 0:
        err = ctypes.get_errno()
        detail = f"source={source!r} type={fstype!r} data={data!r}"
        raise _error("mount", _shown(target), err, detail)


def _shown(target: str) -> str:
    """The path to show for a target: a pinned /proc/self/fd/N by what it points to."""
    if target.startswith(_PROC_FD):
        try:
            return os.readlink(target)
        except OSError:
            return target
    return target


def split_options(options: Sequence[str]) -> tuple[int, int, str]:
    """(flags, propagation flags, data string) for mount(2) from mount(8)-style options."""
    flags = 0
    propagation = 0
    data: list[str] = []
    for option in (o.strip() for opts in options for o in opts.split(",")):
        if not option or option.startswith("x-"):
            continue
        if option in _FLAG_OPTIONS:
            bit, set_it = _FLAG_OPTIONS[option]
            flags = flags | bit if set_it else flags & ~bit
        elif option in _PROPAGATION_OPTIONS:
            propagation |= _PROPAGATION_OPTIONS[option]
        elif option in _UNSUPPORTED_OPTIONS:
            raise MountError("mount", "", "EINVAL", f"option {option!r} needs mount(8)")
        else:
            data.append(option)
    return flags, propagation, ",".join(data)


def mount(
    source: str,
    target: str | os.PathLike[str],
    fstype: str,
    options: Sequence[str] = (),
) -> None:
    """Mount `source` on `target` (mount(2)); options as mount(8) takes them.

    A bind mount with "ro" is done as bind + read-only remount, as the
    kernel ignores MS_RDONLY on the first call; propagation options are a
    further call. `target` may be a `RootLayout.pin` name (/proc/self/fd/N).
    Not idempotent: mounting twice stacks two mounts (callers check
    `is_mount_point` first).
    """
    dest = os.fspath(target)
    try:
        flags, propagation, data = split_options(options)
    except MountError as exc:
        raise MountError("mount", dest, exc.code, exc.message) from None
    _sys_mount(source, dest, fstype, flags, data)
    ro_bind = bool(flags & MS_BIND and flags & MS_RDONLY and not flags & MS_REMOUNT)
    if not ro_bind and not propagation:
        return
    # Follow-up calls must name the new mount's root. A pinned /proc/self/fd/N
    # target still resolves to the directory underneath, so use its path.
    on_top = os.readlink(dest) if dest.startswith(_PROC_FD) else dest
    try:
        if ro_bind:
            _sys_mount("", on_top, "", MS_REMOUNT | MS_BIND | (flags & ~MS_REC), "")
        if propagation:
            _sys_mount("", on_top, "", propagation, "")
    except MountError:
        _sys_umount(on_top, MNT_DETACH | UMOUNT_NOFOLLOW)
        raise


def bind_mount(
    source: str | os.PathLike[str], target: str | os.PathLike[str], read_only: bool = False
) -> None:
    """Bind `source` (a directory or file, e.g. a device node) onto `target`."""
    mount(os.fspath(source), target, "", ("bind", "ro") if read_only else ("bind",))


def mount_tmpfs(target: str | os.PathLike[str], size_bytes: int | None = None) -> None:
    """Mount a fresh tmpfs on `target`, limited to `size_bytes` (kernel default: half of RAM)."""
    options = (f"size={size_bytes}",) if size_bytes is not None and size_bytes > 0 else ()
    mount("tmpfs", target, "tmpfs", options)


def _sys_umount(target: str, flags: int) -> int:
    ok = _libc().umount2(os.fsencode(target), flags)
    return 0 if ok == 0 else ctypes.get_errno()


def umount(target: str | os.PathLike[str], lazy: bool = False) -> bool:
    """Unmount the topmost mount at `target`; True if something was unmounted.

    Idempotent: a missing path or a path that is not a mount point is not
    an error (False). Never follows a symlink at `target`. `lazy` detaches
    the mount even if busy (MNT_DETACH).
    """
    dest = os.fspath(target)
    flags = UMOUNT_NOFOLLOW | (MNT_DETACH if lazy else 0)
    err = _sys_umount(dest, flags)
    if err == 0:
        return True
    if err == errno.ENOENT:
        return False
    if err == errno.EINVAL and not is_mount_point(dest):
        return False
    raise _error("umount", dest, err)


# ------------------------------------------------------------- async variants


async def read_mountinfo_async() -> list[MountInfo]:
    """`read_mountinfo` in a worker thread."""
    return await asyncio.to_thread(read_mountinfo)


async def find_mount_async(path: str | os.PathLike[str]) -> MountInfo | None:
    """`find_mount` in a worker thread."""
    return await asyncio.to_thread(find_mount, path)


async def is_mount_point_async(path: str | os.PathLike[str]) -> bool:
    """`is_mount_point` in a worker thread."""
    return await asyncio.to_thread(is_mount_point, path)


async def mounts_under_async(path: str | os.PathLike[str]) -> list[MountInfo]:
    """`mounts_under` in a worker thread."""
    return await asyncio.to_thread(mounts_under, path)


async def mount_async(
    source: str, target: str | os.PathLike[str], fstype: str, options: Sequence[str] = ()
) -> None:
    """`mount` in a worker thread."""
    await asyncio.to_thread(mount, source, target, fstype, options)


async def bind_mount_async(
    source: str | os.PathLike[str], target: str | os.PathLike[str], read_only: bool = False
) -> None:
    """`bind_mount` in a worker thread."""
    await asyncio.to_thread(bind_mount, source, target, read_only)


async def mount_tmpfs_async(target: str | os.PathLike[str], size_bytes: int | None = None) -> None:
    """`mount_tmpfs` in a worker thread."""
    await asyncio.to_thread(mount_tmpfs, target, size_bytes)


async def umount_async(target: str | os.PathLike[str], lazy: bool = False) -> bool:
    """`umount` in a worker thread."""
    return await asyncio.to_thread(umount, target, lazy)
