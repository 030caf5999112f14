"""The kubelet-style directory layout under the root dir, and path safety.

Every path the volume manager creates or removes is built here from checked
components (`safe_component`), and every directory is created or removed by
walking from the root one component at a time with ``O_NOFOLLOW`` and
``dir_fd``-relative calls. A symlink planted anywhere between the root and
the target is refused with `UnsafePathError`; nothing outside the root is
ever created, opened for writing or removed.

The root itself is configuration and trusted: it is made absolute and its
own symlinks are resolved once, so the paths handed out here are canonical
and can be compared with `/proc/self/mountinfo`.

Layout (kubelet's, reference csi-node-service.md §4)::

    pods/<uid>/volumes/<plugin~escaped>/<name>           filesystem volume of a pod
    pods/<uid>/volumeDevices/<plugin~escaped>/<name>     block device link of a pod
    pods/<uid>/plugins/<plugin~escaped>/<name>           per-pod plugin data (emptyDir "ready")
    plugins/<plugin/name>                                a plugin's global dir
    plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount     CSI staging
    plugins/kubernetes.io/csi/volumeDevices/staging/<specName>          CSI block staging
    plugins/kubernetes.io/csi/volumeDevices/publish/<specName>/<podUID> CSI block publish
    plugins/kubernetes.io/csi/volumeDevices/<specName>/dev/<podUID>     CSI block global map
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from volfsm.errors import VolfsmError
from volfsm.node.mounts import MountInfo, mounts_under

CSI_PLUGIN = "kubernetes.io/csi"
EMPTY_DIR_PLUGIN = "kubernetes.io/empty-dir"

PODS = "pods"
PLUGINS = "plugins"
VOLUMES = "volumes"
VOLUME_DEVICES = "volumeDevices"
POD_PLUGINS = "plugins"
GLOBAL_MOUNT = "globalmount"
CSI_PUBLISH_MOUNT = "mount"
VOL_DATA = "vol_data.json"
BLOCK_STAGING = "staging"
BLOCK_PUBLISH = "publish"
BLOCK_GLOBAL_MAP = "dev"
BLOCK_DATA = "data"

DIR_MODE = 0o750
"""Mode of the directories the layout creates (kubelet uses 0750)."""

NAME_MAX = 255

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PIN_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class UnsafePathError(VolfsmError):
    """A value cannot be used as (part of) a path under the root dir, or a symlink is in the way."""

    def __init__(self, value: object, purpose: str, reason: str) -> None:
        super().__init__(f"unsafe {purpose} {value!r}: {reason}")
        self.value = value
        self.purpose = purpose
        self.reason = reason


class PathInUseError(VolfsmError):
    """A path cannot be removed: it is (or holds) a mount point, or it holds data."""

    def __init__(self, path: Path, reason: str, mounts: tuple[MountInfo, ...] = ()) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.mounts = mounts


# ----------------------------------------------------------------- components


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def component_problem(value: str) -> str | None:
    """Why `value` cannot be a single path component, or None if it can."""
    if value == "":
        return "must not be empty"
    if value in (".", ".."):
        return "must not be '.' or '..'"
    if "/" in value:
        return "must not contain '/'"
    if "\0" in value:
        return "must not contain NUL"
    if _CONTROL.search(value):
        return "must not contain control characters"
    try:
        encoded = os.fsencode(value)
    except UnicodeError:
        return "is not encodable as a file name"
    if len(encoded) > NAME_MAX:
        return f"must be at most {NAME_MAX} bytes"
    return None


def safe_component(value: str, purpose: str = "path component") -> str:
    """`value` unchanged if it is one safe path component; else `UnsafePathError`.

    Refused: '', '.', '..', anything with '/' or NUL or another control
    character, names that cannot be encoded, names longer than 255 bytes.
    `purpose` says what the value was for ("pod UID", "volume name", ...).
    """
    problem = component_problem(value)
    if problem is not None:
        raise UnsafePathError(value, purpose, problem)
    return value


def escape_plugin_name(plugin_name: str) -> str:
    """Kubelet's escaped plugin name for pod dirs: 'kubernetes.io/csi' -> 'kubernetes.io~csi'."""
    return safe_component(plugin_name.replace("/", "~"), "plugin name")


def unescape_plugin_name(escaped: str) -> str:
    """The plugin name back from a pod dir entry: 'kubernetes.io~csi' -> 'kubernetes.io/csi'."""
    return escaped.replace("~", "/")


def plugin_name_parts(plugin_name: str) -> tuple[str, ...]:
    """The components of a plugin's global dir ('kubernetes.io/csi' -> ('kubernetes.io', 'csi'))."""
    return tuple(safe_component(part, "plugin name") for part in plugin_name.split("/"))


def volume_handle_dir_name(volume_handle: str) -> str:
    """The staging dir name of a CSI volume: the sha256 hex of its handle (kubelet >= 1.24)."""
    if volume_handle == "":
        raise UnsafePathError(volume_handle, "CSI volume handle", "must not be empty")
    return hashlib.sha256(volume_handle.encode("utf-8", "surrogatepass")).hexdigest()


_ESCAPED_CSI = "kubernetes.io~csi"


# --------------------------------------------------------------------- layout


class RootLayout:
    """Paths of the kubelet-style layout under one root dir, and safe operations on them."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(os.path.realpath(os.path.abspath(root)))
        self.pods_dir = self.root / PODS
        self.plugins_dir = self.root / PLUGINS

    def __repr__(self) -> str:
        return f"RootLayout({str(self.root)!r})"

    # ------------------------------------------------------------ pod paths

    def pod_dir(self, uid: str) -> Path:
        """pods/<uid>"""
        return self.pods_dir / safe_component(uid, "pod UID")

    def pod_volumes_dir(self, uid: str) -> Path:
        """pods/<uid>/volumes"""
        return self.pod_dir(uid) / VOLUMES

    def pod_volume_dir(self, uid: str, escaped_plugin: str, name: str) -> Path:
        """pods/<uid>/volumes/<plugin~>/<name>: a pod's filesystem volume."""
        return (
            self.pod_volumes_dir(uid)
            / safe_component(escaped_plugin, "escaped plugin name")
            / safe_component(name, "volume name")
        )

    def pod_volume_devices_dir(self, uid: str, escaped_plugin: str) -> Path:
        """pods/<uid>/volumeDevices/<plugin~>: holds the pod's block device links."""
        return (
            self.pod_dir(uid)
            / VOLUME_DEVICES
            / safe_component(escaped_plugin, "escaped plugin name")
        )

    def pod_volume_device_path(self, uid: str, escaped_plugin: str, name: str) -> Path:
        """pods/<uid>/volumeDevices/<plugin~>/<name>: the pod device map path (a symlink)."""
        return self.pod_volume_devices_dir(uid, escaped_plugin) / safe_component(
            name, "volume name"
        )

    def pod_plugin_dir(self, uid: str, escaped_plugin: str, name: str) -> Path:
        """pods/<uid>/plugins/<plugin~>/<name>: per-pod plugin data (emptyDir keeps 'ready')."""
        return (
            self.pod_dir(uid)
            / POD_PLUGINS
            / safe_component(escaped_plugin, "escaped plugin name")
            / safe_component(name, "volume name")
        )

    # --------------------------------------------------------- plugin paths

    def plugin_dir(self, plugin_name: str) -> Path:
        """plugins/<plugin name as a path>, e.g. plugins/kubernetes.io/csi."""
        return self.plugins_dir.joinpath(*plugin_name_parts(plugin_name))

    # ------------------------------------------------------------ CSI paths

    def csi_staging_dir(self, driver: str, volume_handle: str) -> Path:
        """plugins/kubernetes.io/csi/<driver>/<sha256(handle)>: globalmount and vol_data.json."""
        safe_component(driver, "CSI driver name")
        if driver == VOLUME_DEVICES:
            raise UnsafePathError(
                driver, "CSI driver name", "collides with the CSI block dir 'volumeDevices'"
            )
        return self.plugin_dir(CSI_PLUGIN) / driver / volume_handle_dir_name(volume_handle)

    def csi_staging_path(self, driver: str, volume_handle: str) -> Path:
        """plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount"""
        return self.csi_staging_dir(driver, volume_handle) / GLOBAL_MOUNT

    def csi_staging_vol_data_path(self, driver: str, volume_handle: str) -> Path:
        """plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/vol_data.json"""
        return self.csi_staging_dir(driver, volume_handle) / VOL_DATA

    def csi_publish_dir(self, uid: str, name: str) -> Path:
        """pods/<uid>/volumes/kubernetes.io~csi/<name>: the parent kubelet creates."""
        return self.pod_volume_dir(uid, _ESCAPED_CSI, name)

    def csi_publish_path(self, uid: str, name: str) -> Path:
        """pods/<uid>/volumes/kubernetes.io~csi/<name>/mount: NodePublish target_path."""
        return self.csi_publish_dir(uid, name) / CSI_PUBLISH_MOUNT

    def csi_vol_data_path(self, uid: str, name: str) -> Path:
        """pods/<uid>/volumes/kubernetes.io~csi/<name>/vol_data.json"""
        return self.csi_publish_dir(uid, name) / VOL_DATA

    def csi_block_root(self) -> Path:
        """plugins/kubernetes.io/csi/volumeDevices"""
        return self.plugin_dir(CSI_PLUGIN) / VOLUME_DEVICES

    def _block_spec(self, spec_name: str) -> str:
        safe_component(spec_name, "block volume spec name")
        if spec_name in (BLOCK_STAGING, BLOCK_PUBLISH):
            raise UnsafePathError(
                spec_name,
                "block volume spec name",
                f"collides with the CSI block dir 'volumeDevices/{spec_name}'",
            )
        return spec_name

    def csi_block_dir(self, spec_name: str) -> Path:
        """plugins/kubernetes.io/csi/volumeDevices/<specName>"""
        return self.csi_block_root() / self._block_spec(spec_name)

    def csi_block_global_map_path(self, spec_name: str) -> Path:
        """plugins/kubernetes.io/csi/volumeDevices/<specName>/dev: one bind-mounted file per pod."""
        return self.csi_block_dir(spec_name) / BLOCK_GLOBAL_MAP

    def csi_block_vol_data_path(self, spec_name: str) -> Path:
        """plugins/kubernetes.io/csi/volumeDevices/<specName>/data/vol_data.json"""
        return self.csi_block_dir(spec_name) / BLOCK_DATA / VOL_DATA

    def csi_block_staging_path(self, spec_name: str) -> Path:
        """plugins/kubernetes.io/csi/volumeDevices/staging/<specName>: NodeStage staging path."""
        return self.csi_block_root() / BLOCK_STAGING / self._block_spec(spec_name)

    def csi_block_publish_dir(self, spec_name: str) -> Path:
        """plugins/kubernetes.io/csi/volumeDevices/publish/<specName>: kubelet creates it."""
        return self.csi_block_root() / BLOCK_PUBLISH / self._block_spec(spec_name)

    def csi_block_publish_path(self, spec_name: str, uid: str) -> Path:
        """plugins/kubernetes.io/csi/volumeDevices/publish/<specName>/<podUID> (driver's file)."""
        return self.csi_block_publish_dir(spec_name) / safe_component(uid, "pod UID")

    def csi_block_pod_device_dir(self, uid: str) -> Path:
        """pods/<uid>/volumeDevices/kubernetes.io~csi"""
        return self.pod_volume_devices_dir(uid, _ESCAPED_CSI)

    def csi_block_pod_device_path(self, uid: str, spec_name: str) -> Path:
        """pods/<uid>/volumeDevices/kubernetes.io~csi/<specName>: the pod's device link."""
        return self.csi_block_pod_device_dir(uid) / safe_component(spec_name, "volume name")

    # ---------------------------------------------------------- path checks

    def relative_parts(self, path: Path | str) -> tuple[str, ...]:
        """The components of `path` below the root; `UnsafePathError` if it is not inside.

        Purely lexical: `path` must be absolute, lie under the root and
        contain no '.' or '..' components.
        """
        text = os.fspath(path)
        if not os.path.isabs(text):
            raise UnsafePathError(text, "path", "must be absolute")
        root = os.fspath(self.root)
        prefix = root if root.endswith("/") else root + "/"
        if text.rstrip("/") == root.rstrip("/"):
            return ()
        if not text.startswith(prefix):
            raise UnsafePathError(text, "path", f"is not inside the root dir {root}")
        parts = tuple(p for p in text[len(prefix) :].split("/") if p != "")
        for part in parts:
            safe_component(part, f"component of {text}")
        return parts

    def resolve_inside(self, path: Path | str) -> Path:
        """`path` (normalised) if it is inside the root and no existing component is a symlink.

        Missing trailing components are fine (nothing is created). Raises
        `UnsafePathError` for paths outside the root and for a symlink
        anywhere on the way, the final component included.
        """
        parts = self.relative_parts(path)
        if not parts:
            return self.root
        try:
            with self._walk(parts[:-1], create=False) as fd:
                self._check_not_symlink(fd, parts, len(parts) - 1)
        except FileNotFoundError:
            pass
        return self.root.joinpath(*parts)

    def _check_not_symlink(self, fd: int, parts: tuple[str, ...], index: int) -> None:
        try:
            st = os.stat(parts[index], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise self._symlink_error(fd, parts, index)

    def _symlink_error(self, fd: int, parts: tuple[str, ...], index: int) -> UnsafePathError:
        where = self.root.joinpath(*parts[: index + 1])
        try:
            target = os.readlink(parts[index], dir_fd=fd)
            reason = f"{where} is a symlink (to {target!r}); refusing to follow it"
        except OSError:
            reason = f"{where} is not a directory"
        return UnsafePathError(os.fspath(self.root.joinpath(*parts)), "path", reason)

    @contextmanager
    def _walk(self, parts: tuple[str, ...], *, create: bool, mode: int = DIR_MODE) -> Iterator[int]:
        """An fd of root/parts..., walked without following symlinks (created if `create`).

        Each directory is opened first and made only if missing (most walks
        meet directories that exist: no failing mkdir per component).
        """
        try:
            fd = os.open(self.root, _ROOT_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
            os.makedirs(self.root, mode=DIR_MODE, exist_ok=True)
            fd = os.open(self.root, _ROOT_FLAGS)
        try:
            for index in range(len(parts)):
                child = self._open_child(fd, parts, index, create, mode)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def _open_child(
        self, fd: int, parts: tuple[str, ...], index: int, create: bool, mode: int
    ) -> int:
        """parts[index] below the directory open at `fd` (made first if missing and `create`)."""
        try:
            return self._open_dir_at(fd, parts, index)
        except FileNotFoundError:
            if not create:
                raise
        with suppress(FileExistsError):
            os.mkdir(parts[index], mode, dir_fd=fd)
        return self._open_dir_at(fd, parts, index)

    def _open_dir_at(self, fd: int, parts: tuple[str, ...], index: int) -> int:
        """parts[index] below the directory open at `fd`, opened without following a symlink."""
        try:
            return os.open(parts[index], _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._symlink_error(fd, parts, index) from None
            raise

    @contextmanager
    def open_dir(self, path: Path | str, *, create: bool = False) -> Iterator[int]:
        """A read-only fd of the directory `path` inside the root, opened without following links.

        With `create`, missing directories are made (mode 0750) on the way.
        `FileNotFoundError` if it is missing and not created.
        """
        with self._walk(self.relative_parts(path), create=create) as fd:
            yield fd

    def ensure_dir(self, path: Path | str, mode: int = DIR_MODE) -> Path:
        """Create the directory `path` inside the root (and its parents), following no symlink.

        A symlink (or a non-directory) planted anywhere between the root and
        `path` raises `UnsafePathError`; nothing outside the root is created.
        Existing directories are kept as they are.
        """
        parts = self.relative_parts(path)
        with self._walk(parts, create=True, mode=mode):
            pass
        return self.root.joinpath(*parts)

    @contextmanager
    def pin(self, path: Path | str) -> Iterator[str]:
        """A `/proc/self/fd/N` name for `path`, opened without following any symlink.

        The kernel resolves that name to exactly the object opened here, so a
        mount onto it cannot be redirected by a symlink swapped in later.
        Valid only inside the `with` block.
        """
        parts = self.relative_parts(path)
        if not parts:
            raise UnsafePathError(os.fspath(path), "path", "is the root dir itself")
        with self._walk(parts[:-1], create=False) as parent:
            try:
                fd = os.open(parts[-1], _PIN_FLAGS, dir_fd=parent)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise self._symlink_error(parent, parts, len(parts) - 1) from None
                raise
            try:
                if stat.S_ISLNK(os.fstat(fd).st_mode):
                    raise self._symlink_error(parent, parts, len(parts) - 1)
                yield f"/proc/self/fd/{fd}"
            finally:
                os.close(fd)

    # ------------------------------------------------------------- removal

    def _mounts_at_or_under(self, path: Path) -> tuple[MountInfo, ...]:
        return tuple(mounts_under(path))

    def remove_dir(self, path: Path | str, *, stop_at: Path | str | None = None) -> bool:
        """Remove the empty directory `path`, then its empty parents below `stop_at`.

        Never follows a symlink: if `path` itself is a symlink the link is
        removed, nothing it points to. Refuses (`PathInUseError`) if `path`
        is a mount point or is not empty. Parents are removed only while
        they are empty and not mount points, and never `stop_at` or above.
        Returns whether `path` existed.
        """
        parts = self.relative_parts(path)
        if not parts:
            raise UnsafePathError(os.fspath(path), "path", "is the root dir itself")
        stop = len(parts)
        if stop_at is not None:
            stop_parts = self.relative_parts(stop_at)
            stop = len(stop_parts)
            if stop >= len(parts) or parts[:stop] != stop_parts:
                raise UnsafePathError(os.fspath(stop_at), "stop_at", f"is not a parent of {path}")
        target = self.root.joinpath(*parts)
        mounted = self._mounts_at_or_under(target)
        if mounted:
            raise PathInUseError(target, "is or holds a mount point", mounted)
        try:
            with self._walk(parts[:-1], create=False) as parent:
                existed = _remove_entry_if_empty(parent, parts[-1], target)
        except FileNotFoundError:
            return False
        for depth in range(len(parts) - 1, stop, -1):
            if not self._remove_empty_parent(parts[:depth]):
                break
        return existed

    def _remove_empty_parent(self, parts: tuple[str, ...]) -> bool:
        target = self.root.joinpath(*parts)
        if self._mounts_at_or_under(target):
            return False
        try:
            with self._walk(parts[:-1], create=False) as parent:
                os.rmdir(parts[-1], dir_fd=parent)
        except OSError:
            return False
        return True

    def remove_tree(self, path: Path | str) -> bool:
        """Remove `path` and everything below it, following no symlink and crossing no mount.

        Symlinks, including ones pointing outside the root, are removed as
        links. Refuses (`PathInUseError`) before removing anything if a
        mount point is at or under `path`; a mount that appears during the
        walk is detected by its device and mount id and not entered either.
        Returns whether `path` existed.
        """
        parts = self.relative_parts(path)
        if not parts:
            raise UnsafePathError(os.fspath(path), "path", "is the root dir itself")
        target = self.root.joinpath(*parts)
        mounted = self._mounts_at_or_under(target)
        if mounted:
            raise PathInUseError(target, "has mount points at or under it", mounted)
        try:
            with self._walk(parts[:-1], create=False) as parent:
                return _remove_entry_tree(parent, parts[-1], target)
        except FileNotFoundError:
            return False


def remove_own_tree(path: Path) -> None:
    """Remove the directory `path` and everything below it that lies on its parent's mount.

    For trees volfsm made inside a volume dir (the atomic writer's timestamped
    payload dirs). Works on directory fds, never following a symlink: `path`
    itself must be on the same mount as its parent, and every directory below
    is opened and checked for device and mount id before anything in it is
    removed, so a mount made at any time - also a bind mount from the same
    filesystem, which changes no device number - is never entered; a file
    with a mount on it cannot be unlinked (EBUSY). Either raises
    `PathInUseError`, and what belongs to the mount stays; entries already
    removed were the tree's own. Missing `path`: nothing to do.
    """
    try:
        parent = os.open(path.parent, _DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        outer, inner = fd_mount_id(parent), _mount_id_of_child(parent, path.name)
        if outer is not None and inner is not None and outer != inner:
            raise PathInUseError(path, "is a mount point; not crossing it")
        _remove_entry_tree(parent, path.name, path)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            raise PathInUseError(path, "has a mount point inside it") from None
        raise
    finally:
        os.close(parent)


# ------------------------------------------------------------ fd-level helpers


def _remove_entry_if_empty(parent: int, name: str, shown: Path) -> bool:
    """rmdir parent/name (or unlink it if it is not a directory); False if missing."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        return True
    try:
        os.rmdir(name, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise PathInUseError(shown, "is not empty") from None
        if exc.errno == errno.EBUSY:
            raise PathInUseError(shown, "is busy (a mount point)") from None
        raise
    return True


def _remove_entry_tree(parent: int, name: str, shown: Path) -> bool:
    """Remove parent/name recursively: links unlinked, dirs emptied in place, no mount crossed.

    Depth-first without recursion and with one directory fd open at a time
    (a pod can nest directories deeper than the fd limit): going back up
    opens ".." and checks it is the same inode as recorded on the way down.
    """
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        return True
    top = _Top(st.st_dev, _mount_id_of_child(parent, name))
    frames: list[_Frame] = []
    fd = _enter(frames, parent, name, shown, top)
    try:
        while frames:
            frame = frames[-1]
            if frame.subdirs:
                child = frame.subdirs.pop()
                child_fd = _enter(frames, fd, child, frame.where / child, top)
                if child_fd >= 0:
                    os.close(fd)
                    fd = child_fd
                continue
            frames.pop()
            if frames:
                up = os.open("..", _DIR_FLAGS, dir_fd=fd)
                up_st = os.fstat(up)
                os.close(fd)
                fd = up
                if (up_st.st_dev, up_st.st_ino) != (top.device, frames[-1].inode):
                    raise PathInUseError(frames[-1].where, "was moved during removal")
                outer = fd
            else:
                os.close(fd)
                fd = -1
                outer = parent
            try:
                os.rmdir(frame.name, dir_fd=outer)
            except OSError as exc:
                if exc.errno == errno.EBUSY:
                    raise PathInUseError(frame.where, "became a mount point") from None
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise PathInUseError(frame.where, "was written to during removal") from None
                raise
    finally:
        if fd >= 0:
            os.close(fd)
    return True


class _Top:
    __slots__ = ("device", "mount_id")

    def __init__(self, device: int, mount_id: int | None) -> None:
        self.device = device
        self.mount_id = mount_id


class _Frame:
    __slots__ = ("inode", "name", "subdirs", "where")

    def __init__(self, inode: int, name: str, where: Path, subdirs: list[str]) -> None:
        self.inode = inode
        self.name = name
        self.where = where
        self.subdirs = subdirs


def fd_mount_id(fd: int) -> int | None:
    """The mount id an open fd lives on (/proc/self/fdinfo), or None if unavailable."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as fh:
            for line in fh:
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _mount_id_of_child(parent: int, name: str) -> int | None:
    try:
        fd = os.open(name, _PIN_FLAGS, dir_fd=parent)
    except OSError:
        return None
    try:
        return fd_mount_id(fd)
    finally:
        os.close(fd)


def _enter(frames: list[_Frame], parent: int, name: str, where: Path, top: _Top) -> int:
    """Open parent/name, unlink its non-directories and push a frame; its fd, or -1.

    If it is no longer a directory (swapped for a link), it is unlinked and -1 returned.
    """
    fd = _open_child_dir(parent, name, top, where)
    if fd < 0:
        os.unlink(name, dir_fd=parent)
        return -1
    subdirs: list[str] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
                else:
                    os.unlink(entry.name, dir_fd=fd)
        frames.append(_Frame(os.fstat(fd).st_ino, name, where, subdirs))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_child_dir(parent: int, name: str, top: _Top, shown: Path) -> int:
    """fd of parent/name as a directory on the top's mount; -1 if it is (now) not a directory."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return -1
        raise
    if os.fstat(fd).st_dev != top.device or (
        top.mount_id is not None and fd_mount_id(fd) != top.mount_id
    ):
        os.close(fd)
        raise PathInUseError(shown, "is a mount point; not crossing it")
    return fd
