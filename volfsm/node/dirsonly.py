"""Removing directories, never files: the kubelet's ``RemoveDirsOneFilesystem``, with a report.

`remove_dirs` removes the empty directories of a tree under the root dir,
bottom up, and nothing else. What it meets that is not a directory (a
regular file, a symlink, a socket, a fifo, a device node) is kept, and so
is every directory on another filesystem or mount (a mount point is never
entered, whatever is mounted there); each is listed in the result with why.
A directory that holds something kept stays too (it is not listed: what is
in it is). Nothing is ever unlinked, no symlink is followed, and the walk
holds one directory fd at a time (a tree can nest deeper than the fd limit).

`first_kept` answers, without removing anything, whether a tree holds
anything `remove_dirs` would keep (counting from the tree's own filesystem:
a tmpfs mounted at the top is looked into).

Used wherever volfsm cleans up what it cannot prove it created: orphan
cleanup, the dirs of deleted pods, the teardown of a volume the log never
recorded.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from volfsm.node.layout import PathInUseError, RootLayout, UnsafePathError, fd_mount_id
from volfsm.node.mounts import mounts_under

SHOWN = 20
"""How many kept entries a result lists by path (the rest are counted)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

A_FILE = "a file"
A_MOUNT_POINT = "a mount point (not entered)"


def kind_of(mode: int) -> str:
    """What a non-directory is, as the report says it ("a file", "a symlink", ...)."""
    if stat.S_ISREG(mode):
        return A_FILE
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISBLK(mode) or stat.S_ISCHR(mode):
        return "a device node"
    return "not a directory"


@dataclass(frozen=True, slots=True)
class Kept:
    """One thing left in place, and what it is."""

    path: Path
    what: str
    """"a file", "a symlink", ..., A_MOUNT_POINT, or why a directory could not go."""
    foreign: bool = True
    """Whether it is something someone else created (not a mount or an error)."""

    def text(self, owner: str = "") -> str:
        """ "kept: <path>: <what><owner>"; `owner` (" volfsm did not create") is said of
        foreign things only."""
        note = owner if self.foreign else ""
        return f"kept: {self.path}: {self.what}{note}"


@dataclass
class DirsRemoval:
    """What `remove_dirs` did to one tree."""

    path: Path
    existed: bool = False
    removed: int = 0
    """Directories removed."""
    kept: list[Kept] = field(default_factory=list)
    """The first `SHOWN` things kept."""
    kept_count: int = 0
    error: OSError | None = None
    """The first error that kept a directory (EPERM, EIO, ...); those are in `kept` too."""
    error_path: Path | None = None
    """Where `error` happened."""

    @property
    def gone(self) -> bool:
        """Whether the tree is gone (or was never there)."""
        return self.kept_count == 0

    def keep(self, path: Path, what: str, *, foreign: bool = True) -> None:
        """Note one thing kept."""
        self.kept_count += 1
        if len(self.kept) < SHOWN:
            self.kept.append(Kept(path, what, foreign))

    def failed(self, path: Path, exc: OSError) -> None:
        """Note a directory an error kept."""
        if self.error is None:
            self.error, self.error_path = exc, path
        self.keep(path, f"cannot be removed: {exc.strerror or exc}", foreign=False)

    def lines(self, owner: str = "") -> list[str]:
        """One "kept: ..." line per listed thing, and a count of the rest."""
        out = [k.text(owner) for k in self.kept]
        if self.kept_count > len(self.kept):
            out.append(f"and {self.kept_count - len(self.kept)} more kept")
        return out

    def summary(self, owner: str = "", limit: int = 3) -> str:
        """The first `limit` lines joined, and how many more: for one-line messages."""
        lines = self.lines(owner)
        shown = lines[:limit]
        if self.kept_count > len(shown):
            shown.append(f"({self.kept_count} kept in all)")
        return "; ".join(shown)


@dataclass(frozen=True, slots=True)
class _Fs:
    device: int
    mount_id: int | None

    def holds(self, fd: int) -> bool:
        return os.fstat(fd).st_dev == self.device and (
            self.mount_id is None or fd_mount_id(fd) == self.mount_id
        )


def _fs_of(fd: int) -> _Fs:
    return _Fs(os.fstat(fd).st_dev, fd_mount_id(fd))


class _Frame:
    __slots__ = ("inode", "kept", "name", "subdirs", "where")

    def __init__(self, name: str, where: Path, inode: int, subdirs: list[str], kept: bool) -> None:
        self.name = name
        self.where = where
        self.inode = inode
        self.subdirs = subdirs
        self.kept = kept


class _Walk:
    """One bottom-up walk of a tree on one filesystem; with `dry`, stops at the first kept."""

    def __init__(self, result: DirsRemoval, fs: _Fs, *, dry: bool) -> None:
        self.result = result
        self.fs = fs
        self.dry = dry

    def _done(self) -> bool:
        return self.dry and self.result.kept_count > 0

    def _scan(self, fd: int, where: Path) -> tuple[list[str], bool]:
        """(subdirectories, whether anything here is kept)."""
        subdirs: list[str] = []
        kept = False
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)  # a stable report
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
                    continue
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except FileNotFoundError:
                    continue  # gone meanwhile
                kept = True
                self.result.keep(where / entry.name, kind_of(mode))
                if self._done():
                    break
        subdirs.reverse()  # popped from the end: visited in name order
        return subdirs, kept

    def _open(self, parent: int, name: str, where: Path) -> int:
        """fd of parent/name on the walk's filesystem, or -1 (it is then kept)."""
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            return -2  # gone meanwhile: nothing to keep or remove
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                try:
                    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                except FileNotFoundError:
                    return -2
                self.result.keep(where, kind_of(st.st_mode))
            else:
                self.result.failed(where, exc)
            return -1
        if not self.fs.holds(fd):
            os.close(fd)
            self.result.keep(where, A_MOUNT_POINT, foreign=False)
            return -1
        return fd

    def _enter(self, frames: list[_Frame], parent: int, name: str, where: Path) -> int:
        """Open and scan parent/name, push its frame; its fd, or a negative number if not."""
        fd = self._open(parent, name, where)
        if fd < 0:
            return fd
        try:
            subdirs, kept = self._scan(fd, where)
        except OSError as exc:
            os.close(fd)
            self.result.failed(where, exc)
            return -1
        frames.append(_Frame(name, where, os.fstat(fd).st_ino, subdirs, kept))
        return fd

    def run(self, parent: int, name: str, where: Path) -> bool:
        """Walk parent/name; whether it was removed."""
        frames: list[_Frame] = []
        fd = self._enter(frames, parent, name, where)
        if fd < 0:
            return False
        removed_top = False
        try:
            while frames and not self._done():
                frame = frames[-1]
                if frame.subdirs:
                    child = frame.subdirs.pop()
                    child_fd = self._enter(frames, fd, child, frame.where / child)
                    if child_fd >= 0:
                        os.close(fd)
                        fd = child_fd
                    elif child_fd == -1:
                        frame.kept = True
                    continue
                frames.pop()
                if frames:
                    below, fd = fd, -1
                    fd = self._up(below, frames[-1])
                    outer = fd
                else:
                    os.close(fd)
                    fd = -1
                    outer = parent
                gone = not frame.kept and not self.dry and self._rmdir(outer, frame)
                if frames and not gone:
                    frames[-1].kept = True
                removed_top = gone and not frames
        finally:
            if fd >= 0:
                os.close(fd)
        return removed_top

    def _up(self, fd: int, expected: _Frame) -> int:
        """fd of the parent directory (closing `fd`), checked to be the one walked down from."""
        try:
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        st = os.fstat(up)
        if (st.st_dev, st.st_ino) != (self.fs.device, expected.inode):
            os.close(up)
            raise UnsafePathError(os.fspath(expected.where), "path", "was moved during removal")
        return up

    def _rmdir(self, outer: int, frame: _Frame) -> bool:
        if self.dry:
            return False
        try:
            os.rmdir(frame.name, dir_fd=outer)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                self.result.keep(frame.where, "not empty: written to during removal", foreign=False)
            elif exc.errno == errno.EBUSY:
                self.result.keep(frame.where, A_MOUNT_POINT, foreign=False)
            else:
                self.result.failed(frame.where, exc)
            return False
        self.result.removed += 1
        return True


def remove_dirs(layout: RootLayout, path: Path | str) -> DirsRemoval:
    """Remove the empty directories of the tree at `path`, bottom up, on its parent's filesystem.

    `path` itself counts as on another filesystem when it is a mount point
    (it is then kept, not entered). Never removes a non-directory; never
    follows a symlink (one on the way to `path` raises `UnsafePathError`).
    """
    parts = layout.relative_parts(path)
    if not parts:
        raise UnsafePathError(os.fspath(path), "path", "is the root dir itself")
    target = layout.root.joinpath(*parts)
    result = DirsRemoval(target)
    try:
        with layout.open_dir(target.parent) as parent:
            try:
                os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                return result
            result.existed = True
            _Walk(result, _fs_of(parent), dry=False).run(parent, parts[-1], target)
    except FileNotFoundError:
        pass
    return result


def first_kept(layout: RootLayout, path: Path | str) -> Kept | None:
    """The first thing in the tree at `path` that `remove_dirs` would keep, or None.

    Looks from `path`'s own filesystem: for a tmpfs mounted at `path`, what is
    in the tmpfs. A file or link at `path` itself is that thing.
    """
    parts = layout.relative_parts(path)
    if not parts:
        raise UnsafePathError(os.fspath(path), "path", "is the root dir itself")
    target = layout.root.joinpath(*parts)
    result = DirsRemoval(target)
    try:
        with layout.open_dir(target.parent) as parent:
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                return Kept(target, kind_of(st.st_mode))
            with layout.open_dir(target) as top:
                fs = _fs_of(top)
            _Walk(result, fs, dry=True).run(parent, parts[-1], target)
    except FileNotFoundError:
        return None
    return result.kept[0] if result.kept else None


def remove_pod_dir(layout: RootLayout, uid: str) -> DirsRemoval:
    """Remove pods/<uid>, directories only, once its volumes are torn down.

    Refuses (`PathInUseError`, nothing removed) while any mount is under the
    pod dir. Otherwise every empty directory goes and every file stays
    (`etc-hosts`, a container log, a file left in a volume dir): the pod dir
    is gone only when nothing was kept (the kubelet removes the files of the
    pod's other subdirs; volfsm did not create them, so it does not).
    """
    pod = layout.pod_dir(uid)
    mounted = tuple(mounts_under(pod))
    if mounted:
        shown = ", ".join(info.mount_point for info in mounted)
        raise PathInUseError(pod, f"volumes are still mounted under it ({shown})", mounted)
    return remove_dirs(layout, pod)


__all__ = ["A_FILE", "A_MOUNT_POINT", "SHOWN", "DirsRemoval", "Kept", "first_kept", "kind_of",
           "remove_dirs", "remove_pod_dir"]  # fmt: skip
