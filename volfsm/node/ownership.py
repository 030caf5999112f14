"""Volume ownership for a pod's fsGroup: the kubelet's ``SetVolumeOwnership``.

`set_volume_ownership(root, fs_group, policy, read_only=...)` does what
``pkg/volume/volume_linux.go`` does to a volume's directory:

* no fsGroup: nothing;
* policy ``OnRootMismatch``: nothing when the root is a directory owned by
  group fsGroup, with setgid and the permission bits below already set
  (``requiresPermissionChange``); otherwise, and for ``Always`` or no
  policy, every entry of the tree is walked, children before their
  directory, following no symlink;
* per entry: ``lchown(path, -1, fsGroup)`` (the owner stays; a symlink's
  own group changes, never its target's); symlinks get no chmod; anything
  else gets its mode with bits added, never removed: ``0660`` (``0440``
  when the volume is mounted read-only), plus ``0110`` and setgid on
  directories;
* a failed chown / chmod is counted and reported, not fatal (the kubelet
  logs it); an entry removed during the walk is skipped; a directory that
  cannot be read fails the pass.

Where volfsm departs: a chown or chmod that would change nothing is not
made (same result, fewer system calls), and the walk does not cross into
another filesystem mounted inside the volume (the kubelet's walk would;
what is mounted there is not this volume's). Every directory is opened
relative to its parent's fd with ``O_NOFOLLOW``, so a symlink swapped in
during the walk is never followed.

The result says what was done and how long it took: the mount operation
records it (the kubelet's users cannot see where a slow recursive chown
spends its time). Used by emptyDir, CSI (per ``fsGroupPolicy``) and the
object volumes (configMap, secret, downwardAPI, projected).
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

ALWAYS = "Always"
ON_ROOT_MISMATCH = "OnRootMismatch"
POLICIES = (ALWAYS, ON_ROOT_MISMATCH)

RW_MASK = 0o660
RO_MASK = 0o440
EXEC_MASK = 0o110

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class OwnershipError(OSError):
    """A directory of the volume could not be opened or read: the pass failed."""


@dataclass
class OwnershipResult:
    """What one ownership pass did."""

    fs_group: int | None
    policy: str = ""
    walked: bool = False
    entries: int = 0
    chowned: int = 0
    chmodded: int = 0
    errors: int = 0
    first_error: str = ""
    duration_s: float = 0.0
    skipped: str = ""
    """Why no walk was made ("" when one was)."""

    def summary(self) -> str:
        """One line for the operation record."""
        if self.fs_group is None:
            return ""
        head = f"fsGroup {self.fs_group}"
        if not self.walked:
            return f"{head}: not applied ({self.skipped}) in {self.duration_s:.3f}s"
        text = (
            f"{head}: {self.entries} entries walked, {self.chowned} chowned, "
            f"{self.chmodded} chmodded in {self.duration_s:.3f}s"
        )
        if self.errors:
            text += f"; {self.errors} failed (first: {self.first_error})"
        return text


def permission_mask(read_only: bool, is_dir: bool) -> int:
    """The bits the kubelet adds to an entry (symlinks get none)."""
    mask = RO_MASK if read_only else RW_MASK
    if is_dir:
        mask |= EXEC_MASK | stat.S_ISGID
    return mask


def requires_permission_change(root: Path | int, fs_group: int, read_only: bool) -> bool:
    """The kubelet's ``requiresPermissionChange``: whether the root (followed, os.Stat;
    or an open fd) lacks group fsGroup, the rw(x) bits or setgid. True if it cannot be
    stat'ed."""
    try:
        st = os.stat(root)
    except OSError:
        return True
    if st.st_gid != fs_group or not stat.S_ISDIR(st.st_mode):
        return True
    wanted = (RO_MASK if read_only else RW_MASK) | EXEC_MASK
    return (st.st_mode & wanted) != wanted or not st.st_mode & stat.S_ISGID


def set_volume_ownership(
    root: Path | str,
    fs_group: int | None,
    policy: str | None = None,
    *,
    read_only: bool = False,
    dir_fd: int | None = None,
) -> OwnershipResult:
    """Apply `fs_group` to the volume at `root` as the kubelet does (see the module doc).

    With `dir_fd` (an open directory, e.g. from `RootLayout.open_dir`) the walk
    starts there and `root` only names it in messages. `OwnershipError` if a
    directory of the tree cannot be read.
    """
    result = OwnershipResult(fs_group=fs_group, policy=policy or "")
    if fs_group is None:
        result.skipped = "no fsGroup"
        return result
    started = time.monotonic()
    root = Path(root)
    top = root if dir_fd is None else dir_fd
    if policy == ON_ROOT_MISMATCH and not requires_permission_change(top, fs_group, read_only):
        result.skipped = "OnRootMismatch: the root already matches"
    else:
        result.walked = True
        if dir_fd is None:
            _walk_root(root, fs_group, read_only, result)
        else:
            _walk_fd(dir_fd, str(root), fs_group, read_only, result)
    result.duration_s = time.monotonic() - started
    return result


def _walk_root(root: Path, fs_group: int, read_only: bool, result: OwnershipResult) -> None:
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        if not os.path.lexists(root) or not stat.S_ISDIR(os.lstat(root).st_mode):
            _apply_named(root.parent, root.name, fs_group, read_only, result)
            return
        raise OwnershipError(exc.errno, f"opening {root}: {exc.strerror}") from None
    try:
        _walk_fd(fd, str(root), fs_group, read_only, result)
    finally:
        os.close(fd)


def _walk_fd(fd: int, shown: str, fs_group: int, read_only: bool, result: OwnershipResult) -> None:
    """The tree below the directory open at `fd`, then the directory itself."""
    st = os.fstat(fd)
    _walk_dir(fd, shown, st.st_dev, fs_group, read_only, result)
    _apply_fd(fd, os.fstat(fd), fs_group, read_only, result, shown)


def _walk_dir(
    fd: int, shown: str, dev: int, fs_group: int, read_only: bool, result: OwnershipResult
) -> None:
    """Apply to every entry below the directory open at `fd` (children first)."""
    try:
        with os.scandir(fd) as it:
            entries = list(it)
    except OSError as exc:
        raise OwnershipError(exc.errno, f"reading {shown}: {exc.strerror}") from None
    rw = RO_MASK if read_only else RW_MASK
    for entry in entries:
        name = entry.name
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            if st.st_dev != dev:
                continue  # another filesystem mounted inside the volume: not entered
            _walk_subdir(fd, name, f"{shown}/{name}", dev, fs_group, read_only, result)
            continue
        result.entries += 1
        if st.st_gid != fs_group:
            try:
                os.chown(name, -1, fs_group, dir_fd=fd, follow_symlinks=False)
                result.chowned += 1
            except FileNotFoundError:
                continue  # removed during the walk (an old payload dir being reaped)
            except OSError as exc:
                _failed(result, f"chown {shown}/{name}: {exc.strerror}")
        if stat.S_ISLNK(mode):
            continue
        if mode & rw != rw:
            try:
                os.chmod(name, stat.S_IMODE(mode) | rw, dir_fd=fd)
                result.chmodded += 1
            except FileNotFoundError:
                continue
            except OSError as exc:
                _failed(result, f"chmod {shown}/{name}: {exc.strerror}")


def _walk_subdir(
    parent: int,
    name: str,
    shown: str,
    dev: int,
    fs_group: int,
    read_only: bool,
    result: OwnershipResult,
) -> None:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OwnershipError(exc.errno, f"opening {shown}: {exc.strerror}") from None
    try:
        _walk_dir(fd, shown, dev, fs_group, read_only, result)
        _apply_fd(fd, os.fstat(fd), fs_group, read_only, result, shown)
    finally:
        os.close(fd)


def _apply_fd(
    fd: int,
    st: os.stat_result,
    fs_group: int,
    read_only: bool,
    result: OwnershipResult,
    shown: str,
) -> None:
    """Group and bits of an open directory."""
    result.entries += 1
    if st.st_gid != fs_group:
        try:
            os.fchown(fd, -1, fs_group)
            result.chowned += 1
        except OSError as exc:
            _failed(result, f"chown {shown}: {exc.strerror}")
    mask = permission_mask(read_only, is_dir=True)
    if st.st_mode & mask != mask:
        try:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | mask)
            result.chmodded += 1
        except OSError as exc:
            _failed(result, f"chmod {shown}: {exc.strerror}")


def _apply_named(
    parent: Path, name: str, fs_group: int, read_only: bool, result: OwnershipResult
) -> None:
    """A root that is no directory (a file volume): lchown, chmod unless a symlink."""
    try:
        st = os.lstat(parent / name)
    except OSError as exc:
        raise OwnershipError(exc.errno, f"stat {parent / name}: {exc.strerror}") from None
    result.entries += 1
    path = parent / name
    if st.st_gid != fs_group:
        try:
            os.chown(path, -1, fs_group, follow_symlinks=False)
            result.chowned += 1
        except OSError as exc:
            _failed(result, f"chown {path}: {exc.strerror}")
    if stat.S_ISLNK(st.st_mode):
        return
    mask = permission_mask(read_only, is_dir=False)
    if st.st_mode & mask != mask:
        try:
            os.chmod(path, stat.S_IMODE(st.st_mode) | mask)
            result.chmodded += 1
        except OSError as exc:
            _failed(result, f"chmod {path}: {exc.strerror}")


def _failed(result: OwnershipResult, what: str) -> None:
    result.errors += 1
    if not result.first_error:
        result.first_error = what
