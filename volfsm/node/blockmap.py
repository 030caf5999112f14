"""Generic block-volume mapping done by the operation layer (kubelet MapBlockVolume).

After a block plugin has published a device for a pod (MapPodDevice), the
kubelet maps it in three steps, undone in reverse by UnmapBlockVolume:

1. global map path: ``<global_map_dir>/<podUID>`` is a regular file onto
   which the device node is **bind-mounted** (kubelet's MapDevice with
   bindMount=true). One file per pod; the bind mounts are the device's
   reference count (`device_bind_mount_refs`, GetDeviceBindMountRefs).
2. pod device map path: ``<pod_device_dir>/<volume_name>`` is a **symlink**
   to the device (MapDevice with bindMount=false); the container runtime
   hands that to the pod.
3. the "fd lock": a loop device is attached, read-only, on the global map
   file (AttachFileDevice / ``losetup -f``). The loop device keeps the
   block device open, so it cannot be silently detached and replaced while
   a pod maps it. Unmap detaches it (DetachFileDevice / ``losetup -d``).

The brief's notes called the global map entry a symlink; the kubelet code in
the seed bind-mounts the device onto a file instead (so that the device
stays referenced even if the /dev node changes), and this module follows the
kubelet. Loop devices are handled with the ``losetup`` command (as kubelet
does): its --find is race-safe against other loop users on the node.

All paths are checked to lie inside the root; directories are created and
entries removed without following symlinks: a symlink planted on the way to
a map dir raises UnsafePathError; one planted at the pod's own entry (the
global map file or the device link) is removed as a link and replaced.
Every call is idempotent.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from volfsm.errors import VolfsmError
from volfsm.node import mounts
from volfsm.node.layout import PathInUseError, RootLayout, UnsafePathError, safe_component

SYS_BLOCK = Path("/sys/block")
LOSETUP = "losetup"
_DELETED = " (deleted)"
_FILE_MODE = 0o640


class BlockMapError(VolfsmError):
    """Mapping or unmapping a block volume failed."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True)
class BlockMapResult:
    """What map_block_volume set up for one pod."""

    device_path: str
    """The block device, symlinks resolved (EvalHostSymlinks)."""
    global_map_path: Path
    """<global_map_dir>/<podUID>: a file with the device bind-mounted on it."""
    pod_device_path: Path
    """<pod_device_dir>/<volume_name>: symlink to the device."""
    loop_device: str
    """The loop device holding the device open ("fd lock"), e.g. /dev/loop3."""


# ---------------------------------------------------------------- loop devices


def _backing_file(sys_loop_dir: Path) -> str | None:
    try:
        text = (sys_loop_dir / "loop" / "backing_file").read_text().rstrip("\n")
    except OSError:
        return None
    return text.removesuffix(_DELETED)


def loop_devices_for(backing: Path | str) -> list[str]:
    """Loop devices whose backing file is `backing` (by /sys/block/loop*/loop/backing_file)."""
    wanted = os.fspath(backing)
    found = []
    for entry in sorted(SYS_BLOCK.glob("loop*")):
        if _backing_file(entry) == wanted:
            found.append(f"/dev/{entry.name}")
    return found


def _losetup(*args: str) -> str:
    proc = subprocess.run([LOSETUP, *args], capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        raise BlockMapError(
            args[-1], f"losetup {' '.join(args)} failed: {proc.stderr.strip() or proc.returncode}"
        )
    return proc.stdout.strip()


def attach_lock(path: Path) -> str:
    """The read-only loop device on `path`, attaching one if there is none yet."""
    existing = loop_devices_for(path)
    if existing:
        return existing[0]
    device = _losetup("--find", "--show", "--read-only", os.fspath(path))
    if not device.startswith("/dev/loop"):
        raise BlockMapError(os.fspath(path), f"losetup printed {device!r}, not a loop device")
    return device


def detach_lock(path: Path) -> list[str]:
    """Detach every loop device backed by `path`; the ones detached. Idempotent."""
    detached = []
    for device in loop_devices_for(path):
        try:
            _losetup("--detach", device)
        except BlockMapError:
            if device in loop_devices_for(path):
                raise
            continue  # detached by someone else meanwhile
        detached.append(device)
    return detached


def device_opened(device_path: str) -> bool:
    """Whether a block device is open elsewhere (exclusive open fails with EBUSY).

    kubelet's DeviceOpened: used after unmap/unstage to decide whether the
    device is still in use. Non-block paths answer False.
    """
    try:
        st = os.stat(device_path)
    except FileNotFoundError:
        return False
    if not stat.S_ISBLK(st.st_mode):
        return False
    try:
        fd = os.open(device_path, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return True
        raise
    os.close(fd)
    return False


# --------------------------------------------------------------------- mapping


def _resolve_device(device_path: str) -> tuple[str, int]:
    """(real path, st_rdev) of a block device; BlockMapError if it is not one."""
    if not device_path or not os.path.isabs(device_path):
        raise BlockMapError(device_path, "device path must be absolute")
    real = os.path.realpath(device_path)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise BlockMapError(device_path, f"cannot stat device: {exc.strerror}") from None
    if not stat.S_ISBLK(st.st_mode):
        raise BlockMapError(device_path, f"{real} is not a block device")
    return real, st.st_rdev


def _ensure_bind_file(layout: RootLayout, file_path: Path, device: str, rdev: int) -> None:
    """<global_map_dir>/<podUID>: a regular file with `device` bind-mounted on it."""
    with layout.open_dir(file_path.parent, create=True) as dir_fd:
        name = file_path.name
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISBLK(st.st_mode) and not mounts.is_mount_point(file_path):
            os.unlink(name, dir_fd=dir_fd)  # a device node made here, not our bind: replace it
            st = None
        if st is not None and stat.S_ISBLK(st.st_mode):
            if st.st_rdev != rdev:
                raise BlockMapError(
                    os.fspath(file_path),
                    f"already maps device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}, "
                    f"not {device}; refusing to replace a mapped volume",
                )
            return
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise PathInUseError(file_path, "is a directory; expected the global map file")
        if st is not None and not stat.S_ISREG(st.st_mode):
            os.unlink(name, dir_fd=dir_fd)  # a planted link or fifo: neutralise it
            st = None
        if st is None:
            fd = os.open(
                name,
                os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                _FILE_MODE,
                dir_fd=dir_fd,
            )
            os.close(fd)
    with layout.pin(file_path) as target:
        mounts.bind_mount(device, target)


def _ensure_symlink(layout: RootLayout, link_path: Path, device: str) -> None:
    """<pod_device_dir>/<volume_name> -> device, replacing a stale link or file."""
    with layout.open_dir(link_path.parent, create=True) as dir_fd:
        name = link_path.name
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=dir_fd) == device:
                return
            if stat.S_ISDIR(st.st_mode):
                raise PathInUseError(link_path, "is a directory; expected the device link")
            os.unlink(name, dir_fd=dir_fd)
        os.symlink(device, name, dir_fd=dir_fd)


def map_block_volume(
    layout: RootLayout,
    device_path: str,
    global_map_dir: Path,
    pod_uid: str,
    pod_device_dir: Path,
    volume_name: str,
) -> BlockMapResult:
    """Map a published block device for one pod (kubelet util.MapBlockVolume). Idempotent.

    `global_map_dir` (e.g. ``layout.csi_block_global_map_path(spec)``) and
    `pod_device_dir` (e.g. ``layout.csi_block_pod_device_dir(uid)``) must be
    inside the root. Raises BlockMapError, UnsafePathError, PathInUseError
    or mounts.MountError; a partial map is undone by `unmap_block_volume`.
    """
    global_path, pod_path = _paths(layout, global_map_dir, pod_uid, pod_device_dir, volume_name)
    device, rdev = _resolve_device(device_path)
    # Both dirs first, so a planted symlink is refused before anything is mounted.
    layout.ensure_dir(global_path.parent)
    layout.ensure_dir(pod_path.parent)
    _ensure_bind_file(layout, global_path, device, rdev)
    _ensure_symlink(layout, pod_path, device)
    loop = attach_lock(global_path)
    return BlockMapResult(device, global_path, pod_path, loop)


def unmap_block_volume(
    layout: RootLayout,
    global_map_dir: Path,
    pod_uid: str,
    pod_device_dir: Path,
    volume_name: str,
) -> None:
    """Undo map_block_volume for one pod (kubelet util.UnmapBlockVolume). Idempotent.

    Order as kubelet: release the loop "fd lock", remove the pod's device
    link, unmount and remove the pod's global map file. Links are removed as
    links; a symlink planted on the way raises UnsafePathError and nothing
    is touched.
    """
    global_path, pod_path = _paths(layout, global_map_dir, pod_uid, pod_device_dir, volume_name)
    layout.resolve_inside(global_path.parent)  # refuse a planted symlink before any change
    layout.resolve_inside(pod_path.parent)
    detach_lock(global_path)
    _remove_non_dir(layout, pod_path)
    try:
        with layout.open_dir(global_path.parent):  # no symlink on the way (checked, then act)
            mounts.umount(global_path)
            if mounts.is_mount_point(global_path):
                raise PathInUseError(global_path, "is still mounted (stacked bind mounts)")
    except FileNotFoundError:
        return
    _remove_non_dir(layout, global_path)


def _paths(
    layout: RootLayout, global_map_dir: Path, pod_uid: str, pod_device_dir: Path, volume_name: str
) -> tuple[Path, Path]:
    """The pod's global map file and device link, checked (lexically) to be inside the root."""
    global_path = Path(global_map_dir) / safe_component(pod_uid, "pod UID")
    pod_path = Path(pod_device_dir) / safe_component(volume_name, "volume name")
    layout.relative_parts(global_path)
    layout.relative_parts(pod_path)
    return global_path, pod_path


def _remove_non_dir(layout: RootLayout, path: Path) -> None:
    try:
        with layout.open_dir(path.parent) as dir_fd:
            try:
                st = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if stat.S_ISDIR(st.st_mode):
                raise PathInUseError(path, "is a directory; expected a file or link")
            os.unlink(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return


def device_bind_mount_refs(layout: RootLayout, global_map_dir: Path) -> list[Path]:
    """Pods' global map files under `global_map_dir` that still have a device bound on them.

    kubelet's GetDeviceBindMountRefs: UnmapDevice refuses while any remain.
    """
    directory = Path(global_map_dir)
    refs: list[Path] = []
    mounted = {info.mount_point for info in mounts.mounts_under(directory)}
    try:
        with layout.open_dir(directory) as dir_fd, os.scandir(dir_fd) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                path = directory / entry.name
                if stat.S_ISBLK(st.st_mode) or os.fspath(path) in mounted:
                    refs.append(path)
    except FileNotFoundError:
        return []
    return sorted(refs)


def remove_global_map_dir(layout: RootLayout, global_map_dir: Path) -> bool:
    """Remove the global map dir once no pod maps the device (kubelet RemoveMapPath).

    Refuses with PathInUseError while `device_bind_mount_refs` is not empty.
    Returns whether the dir existed.
    """
    refs = device_bind_mount_refs(layout, global_map_dir)
    if refs:
        shown = ", ".join(p.name for p in refs)
        raise PathInUseError(Path(global_map_dir), f"still mapped by other references: {shown}")
    return layout.remove_tree(global_map_dir)


# -------------------------------------------------------------- async variants


async def map_block_volume_async(
    layout: RootLayout,
    device_path: str,
    global_map_dir: Path,
    pod_uid: str,
    pod_device_dir: Path,
    volume_name: str,
) -> BlockMapResult:
    """`map_block_volume` in a worker thread."""
    return await asyncio.to_thread(
        map_block_volume, layout, device_path, global_map_dir, pod_uid, pod_device_dir, volume_name
    )


async def unmap_block_volume_async(
    layout: RootLayout,
    global_map_dir: Path,
    pod_uid: str,
    pod_device_dir: Path,
    volume_name: str,
) -> None:
    """`unmap_block_volume` in a worker thread."""
    await asyncio.to_thread(
        unmap_block_volume, layout, global_map_dir, pod_uid, pod_device_dir, volume_name
    )


async def device_bind_mount_refs_async(layout: RootLayout, global_map_dir: Path) -> list[Path]:
    """`device_bind_mount_refs` in a worker thread."""
    return await asyncio.to_thread(device_bind_mount_refs, layout, global_map_dir)


async def remove_global_map_dir_async(layout: RootLayout, global_map_dir: Path) -> bool:
    """`remove_global_map_dir` in a worker thread."""
    return await asyncio.to_thread(remove_global_map_dir, layout, global_map_dir)


async def device_opened_async(device_path: str) -> bool:
    """`device_opened` in a worker thread."""
    return await asyncio.to_thread(device_opened, device_path)


__all__ = [
    "BlockMapError",
    "BlockMapResult",
    "UnsafePathError",
    "attach_lock",
    "detach_lock",
    "device_bind_mount_refs",
    "device_opened",
    "loop_devices_for",
    "map_block_volume",
    "remove_global_map_dir",
    "unmap_block_volume",
]
