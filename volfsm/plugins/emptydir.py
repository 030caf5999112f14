"""The emptyDir plugin: a directory per pod volume, or a tmpfs for ``medium: Memory``.

Like kubelet's emptyDir it is neither attachable nor device-mountable and
has no block mode. SetUp creates
``pods/<uid>/volumes/kubernetes.io~empty-dir/<name>`` (mode 0777), mounts a
tmpfs there for medium Memory (``size=`` the size limit when one is set;
otherwise the kernel default), and marks the volume ready in
``pods/<uid>/plugins/kubernetes.io~empty-dir/<name>/ready``. TearDown
removes the ready marker, unmounts the tmpfs and removes the directory and
whatever the pod wrote into it. Pod-written symlinks are removed as links:
nothing they point to is followed, read or removed, and no mount is crossed.
That is for volumes the log recorded creating. A volume found on the node
that the log never recorded (a lost log, an adopted root dir) is torn down
with ``keep_files``: only directories are removed (and the plugin's own empty
``ready`` marker), every file stays and is reported, and a tmpfs holding any
file stays mounted (an empty one is unmounted).

Error classes. In kubelet every emptyDir SetUp error is final (the plugin
returns plain errors). volfsm refines that where "final" would lose a mount:

* before the node was changed (an unsafe name, a symlink planted on the
  way, an unknown medium, a mount path that is not this plugin's): TRANSIENT,
  the recorded state is left as it is;
* creating the directory or mounting the tmpfs failed (EACCES, ENOSPC,
  ENOMEM, ...): FINAL, as in kubelet: the syscall answered and nothing is
  mounted at the path;
* a failure after the tmpfs is mounted (writing the ready marker), or a
  foreign mount found at the path: UNCERTAIN, so the pod-volume stays
  Uncertain and is torn down later instead of being forgotten mounted;
* every TearDown error: UNCERTAIN (the executor marks a failed teardown
  Uncertain anyway).

Error codes are errno names ("EACCES") for system call failures, otherwise
"UnsafePath", "InvalidArgument", "MediumMismatch", "MountedInside".

Reconstruction (kubelet's emptyDir ConstructVolumeSpec): a volume is rebuilt
from its path, its medium from the mount there (a tmpfs: ``Memory``; none:
node disk; anything else is not an emptyDir). The plugin also says that a
``Memory`` volume must have its tmpfs mounted, so a vanished tmpfs makes the
entry Uncertain, while a plain one is just a directory.
"""

from __future__ import annotations

import asyncio
import os
import stat
from dataclasses import replace
from pathlib import Path

from events.types import DesiredVolume, VolumeSource
from volfsm.desired.resolve import empty_dir_volume_id
from volfsm.node import mounts, ownership
from volfsm.node.dirsonly import Kept, first_kept, remove_dirs
from volfsm.node.layout import (
    EMPTY_DIR_PLUGIN,
    PathInUseError,
    RootLayout,
    UnsafePathError,
    escape_plugin_name,
)
from volfsm.plugins.base import (
    ConstructedSpec,
    ErrorClass,
    MountResult,
    NodeView,
    PluginError,
    PodVolumeDir,
    VolumePlugin,
    VolumeRequest,
    os_error,
    teardown_errors,
)

MEDIUM_DEFAULT = ""
MEDIUM_MEMORY = "Memory"
SUPPORTED_MEDIA = (MEDIUM_DEFAULT, MEDIUM_MEMORY)
ESCAPED_NAME = escape_plugin_name(EMPTY_DIR_PLUGIN)
VOLUME_DIR_MODE = 0o777
READY_FILE = "ready"
_MEMORY_FS = frozenset({"tmpfs", "hugetlbfs"})
_MAX_STACKED = 16
KEPT_OWNER = " the log did not create"
NOT_UNDER_VOLUMES = "an emptyDir entry that is not a directory under volumes/"


class EmptyDirPlugin(VolumePlugin):
    """kubernetes.io/empty-dir for real: a directory, or a size-limited tmpfs."""

    name = EMPTY_DIR_PLUGIN

    def __init__(self, layout: RootLayout, memory_bytes: int | None = None) -> None:
        self.layout = layout
        self.memory_bytes = memory_bytes
        """The node's allocatable memory: a memory volume's size when nothing smaller is set
        (None: the kernel's default, half the RAM)."""
        self._layouts: dict[Path, RootLayout] = {layout.root: layout}

    def supports(self, source: VolumeSource) -> bool:
        """Whether `source` is an emptyDir."""
        return source.plugin == self.name

    def can_serve(self, source: VolumeSource, volume_mode: str) -> str | None:
        """Filesystem mode only; medium "" (node disk) or "Memory" (HugePages not served)."""
        problem = super().can_serve(source, volume_mode)
        if problem is not None:
            return problem
        if source.medium.startswith("HugePages"):
            return (
                f"emptyDir medium {source.medium!r} is not served on this node: volfsm mounts "
                "no hugetlbfs and reserves no huge pages (use '' or 'Memory')"
            )
        if source.medium not in SUPPORTED_MEDIA:
            return f"emptyDir medium {source.medium!r} is not supported (use '' or 'Memory')"
        return None

    # --------------------------------------------------------- reconstruction

    def construct_volume_spec(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | str:
        """The volume from its path; medium Memory if a tmpfs is mounted there."""
        if not entry.is_dir:
            return NOT_UNDER_VOLUMES
        mount = node.mount_at(entry.path)
        medium = MEDIUM_DEFAULT
        if mount is not None:
            if mount.fstype != "tmpfs":
                return f"a {mount.fstype} mount where an emptyDir belongs"
            medium = MEDIUM_MEMORY
        source = VolumeSource(plugin=EMPTY_DIR_PLUGIN, medium=medium)
        vid = empty_dir_volume_id(entry.pod_uid, entry.name)
        return ConstructedSpec(DesiredVolume(name=entry.name, volume_id=vid, source=source))

    def construct_block_volume_spec(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | str:
        """None: an emptyDir has no block mode."""
        return NOT_UNDER_VOLUMES

    def spec_from_volume_id(self, volume_id: str, pod_uid: str, name: str) -> DesiredVolume | None:
        """The pod's emptyDir `name` if `volume_id` is its id; the medium is unknown (a tmpfs
        there is found and unmounted by the teardown)."""
        if volume_id != empty_dir_volume_id(pod_uid, name):
            return None
        source = VolumeSource(plugin=EMPTY_DIR_PLUGIN)
        return DesiredVolume(name=name, volume_id=volume_id, source=source)

    def expected_pod_mount(self, spec: DesiredVolume) -> str | None:
        """A tmpfs for medium Memory; nothing for a plain emptyDir (a directory)."""
        return "emptyDir tmpfs" if spec.source.medium == MEDIUM_MEMORY else ""

    # ------------------------------------------------------------------ paths

    def _layout_for(self, root: Path) -> RootLayout:
        layout = self._layouts.get(root)
        if layout is None:
            layout = RootLayout(root)
            self._layouts[root] = self._layouts[layout.root] = layout
        return layout

    def pod_mount_path(self, root: Path, req: VolumeRequest) -> Path:
        """pods/<uid>/volumes/kubernetes.io~empty-dir/<name> under `root`."""
        return self._layout_for(root).pod_volume_dir(req.pod_uid, ESCAPED_NAME, req.volume_name)

    def _paths(self, req: VolumeRequest) -> tuple[Path, Path]:
        """(volume dir, ready-marker dir) for the request; TRANSIENT PluginError if unusable."""
        try:
            volume_dir = self.layout.pod_volume_dir(req.pod_uid, ESCAPED_NAME, req.volume_name)
            meta_dir = self.layout.pod_plugin_dir(req.pod_uid, ESCAPED_NAME, req.volume_name)
        except UnsafePathError as exc:
            raise PluginError("UnsafePath", str(exc), ErrorClass.TRANSIENT) from None
        if req.mount_path is not None and Path(req.mount_path) != volume_dir:
            raise PluginError(
                "InvalidArgument",
                f"mount path {req.mount_path} is not the emptyDir path {volume_dir}",
                ErrorClass.TRANSIENT,
            )
        return volume_dir, meta_dir

    # ------------------------------------------------------------------ set up

    async def set_up(self, req: VolumeRequest) -> MountResult:
        """Create the volume dir (and tmpfs for medium Memory). Idempotent."""
        return await asyncio.to_thread(self._set_up, req)

    def _set_up(self, req: VolumeRequest) -> MountResult:
        volume_dir, meta_dir = self._paths(req)
        medium = req.source.medium
        if medium not in SUPPORTED_MEDIA:
            raise PluginError(
                "InvalidArgument",
                f"emptyDir medium {medium!r} is not supported",
                ErrorClass.TRANSIENT,
            )
        was_ready = self._is_ready(meta_dir)
        self._make_volume_dir(volume_dir)
        if medium == MEDIUM_MEMORY:
            result = self._mount_tmpfs(
                volume_dir, memory_volume_size(req.source, self.memory_bytes)
            )
        else:
            result = MountResult(path=str(volume_dir), mount_found=None, detail="directory")
        if not was_ready:
            result = self._apply_fs_group(volume_dir, req, result)
        try:
            self._mark_ready(meta_dir)
        except (OSError, UnsafePathError) as exc:
            error_class = ErrorClass.UNCERTAIN if medium == MEDIUM_MEMORY else ErrorClass.FINAL
            if isinstance(exc, UnsafePathError):
                raise PluginError("UnsafePath", str(exc), error_class) from None
            raise os_error(exc, f"marking {meta_dir} ready", error_class) from None
        return result

    def _make_volume_dir(self, volume_dir: Path) -> None:
        try:
            self.layout.ensure_dir(volume_dir)
            with self.layout.open_dir(volume_dir) as fd:
                mode = os.fstat(fd).st_mode
                if stat.S_IMODE(mode) & 0o777 != VOLUME_DIR_MODE:
                    os.fchmod(fd, (stat.S_IMODE(mode) & 0o7000) | VOLUME_DIR_MODE)
        except UnsafePathError as exc:
            raise PluginError("UnsafePath", str(exc), ErrorClass.TRANSIENT) from None
        except OSError as exc:
            raise os_error(exc, f"creating {volume_dir}", ErrorClass.FINAL) from None

    def _mount_tmpfs(self, volume_dir: Path, size_limit: int | None) -> MountResult:
        existing = mounts.find_mount(volume_dir)
        if existing is not None and existing.fstype != "tmpfs":
            raise PluginError(
                "MediumMismatch",
                f"{volume_dir} is already a {existing.fstype} mount, not tmpfs",
                ErrorClass.UNCERTAIN,
            )
        if existing is None:
            size = size_limit if size_limit is not None and size_limit > 0 else None
            try:
                with self.layout.pin(volume_dir) as target:
                    mounts.mount_tmpfs(target, size)
            except UnsafePathError as exc:
                raise PluginError("UnsafePath", str(exc), ErrorClass.TRANSIENT) from None
            except mounts.MountError as exc:
                raise PluginError(exc.code, str(exc), ErrorClass.FINAL) from None
            except OSError as exc:
                raise os_error(exc, f"mounting tmpfs on {volume_dir}", ErrorClass.FINAL) from None
        found = mounts.find_mount(volume_dir)
        mounted = found is not None and found.fstype == "tmpfs"
        detail = "tmpfs"
        if found is not None and found.super_option("size") is not None:
            detail = f"tmpfs size={found.super_option('size')}"
        return MountResult(path=str(volume_dir), mount_found=mounted, detail=detail)

    def _is_ready(self, meta_dir: Path) -> bool:
        """Whether an earlier SetUp finished (its ready marker is there)."""
        try:
            with self.layout.open_dir(meta_dir) as fd:
                return _lstat(fd, READY_FILE) is not None
        except (FileNotFoundError, UnsafePathError):
            return False

    def _apply_fs_group(
        self, volume_dir: Path, req: VolumeRequest, result: MountResult
    ) -> MountResult:
        """The pod's fsGroup on the new volume (kubelet: always, no change policy, rw)."""
        if req.fs_group is None:
            return result
        try:
            with self.layout.open_dir(volume_dir) as fd:
                done = ownership.set_volume_ownership(volume_dir, req.fs_group, dir_fd=fd)
        except (OSError, UnsafePathError) as exc:
            error_class = (
                ErrorClass.UNCERTAIN if req.source.medium == MEDIUM_MEMORY else ErrorClass.FINAL
            )
            raise PluginError(
                "FSGroupFailed", f"applying fsGroup to {volume_dir}: {exc}", error_class
            ) from None
        return replace(result, ownership=done.summary(), ownership_s=done.duration_s)

    def _mark_ready(self, meta_dir: Path) -> None:
        with self.layout.open_dir(meta_dir, create=True) as fd:
            flags = os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(READY_FILE, flags, 0o640, dir_fd=fd))

    # --------------------------------------------------------------- tear down

    async def tear_down(self, req: VolumeRequest) -> str | None:
        """Unmount (tmpfs) and remove the volume dir with its contents. Idempotent.

        With `req.keep_files` (the log never recorded creating the volume)
        no file is deleted: see `_tear_down_keeping`; returns what stayed.
        """
        return await asyncio.to_thread(self._tear_down, req)

    def _tear_down(self, req: VolumeRequest) -> str | None:
        volume_dir, meta_dir = self._paths(req)
        with teardown_errors(volume_dir):
            if req.keep_files:
                return self._tear_down_keeping(volume_dir, meta_dir)
            self.layout.remove_tree(meta_dir)
            self._unmount_and_remove(volume_dir)
        return None

    def _tear_down_keeping(self, volume_dir: Path, meta_dir: Path) -> str | None:
        """Tear down a volume the log did not create: directories go, files stay.

        The plugin's own empty ``ready`` marker goes; everything else in the
        volume is kept. A tmpfs holding any file stays mounted (unmounting it
        would destroy the files); an empty one is unmounted. Returns what
        stayed, or None.
        """
        self._remove_ready_marker(meta_dir)
        kept = [remove_dirs(self.layout, meta_dir)]
        held = self._unmount_empty_memory(volume_dir)
        if held is not None:
            return (
                f"the tmpfs at {volume_dir} stays mounted: it holds what the log did not"
                f" create ({held.text()})"
            )
        kept.append(remove_dirs(self.layout, volume_dir))
        shown = "; ".join(r.summary(KEPT_OWNER) for r in kept if not r.gone)
        return shown or None

    def _remove_ready_marker(self, meta_dir: Path) -> None:
        """Unlink meta_dir/ready if it is what set_up writes: an empty regular file."""
        try:
            with self.layout.open_dir(meta_dir) as fd:
                st = _lstat(fd, READY_FILE)
                if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == 0:
                    os.unlink(READY_FILE, dir_fd=fd)
        except FileNotFoundError:
            return

    def _unmount_empty_memory(self, volume_dir: Path) -> Kept | None:
        """Unmount the tmpfs layers at the dir while they hold no file; what one holds, or None."""
        inside = [i for i in mounts.mounts_under(volume_dir) if i.mount_point != str(volume_dir)]
        if inside:
            shown = ", ".join(info.mount_point for info in inside)
            raise PathInUseError(volume_dir, f"other mounts inside the volume: {shown}")
        for _ in range(_MAX_STACKED):
            found = mounts.find_mount(volume_dir)
            if found is None:
                return None
            if found.fstype not in _MEMORY_FS:
                raise PluginError(
                    "MediumMismatch",
                    f"{volume_dir} is a {found.fstype} mount, not an emptyDir tmpfs; not removing",
                    ErrorClass.UNCERTAIN,
                )
            held = first_kept(self.layout, volume_dir)
            if held is not None:
                return held
            mounts.umount(volume_dir)
        raise PathInUseError(volume_dir, f"more than {_MAX_STACKED} stacked mounts")

    def _unmount_and_remove(self, volume_dir: Path) -> None:
        try:
            with self.layout.open_dir(volume_dir.parent) as parent:
                st = _lstat(parent, volume_dir.name)
                if st is None:
                    return
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(volume_dir.name, dir_fd=parent)  # a planted link: remove the link
                    return
                self._unmount_memory(volume_dir)
        except FileNotFoundError:
            return
        self.layout.remove_tree(volume_dir)

    def _unmount_memory(self, volume_dir: Path) -> None:
        """Unmount tmpfs/hugetlbfs at the dir (kubelet detects the medium from the mount)."""
        target = os.fspath(volume_dir)
        under = mounts.mounts_under(volume_dir)
        inside = [info for info in under if info.mount_point != target]
        if inside:
            shown = ", ".join(info.mount_point for info in inside)
            raise PathInUseError(volume_dir, f"other mounts inside the volume: {shown}")
        for _ in range(_MAX_STACKED):
            found = mounts.find_mount(volume_dir)
            if found is None:
                return
            if found.fstype not in _MEMORY_FS:
                raise PluginError(
                    "MediumMismatch",
                    f"{volume_dir} is a {found.fstype} mount, not an emptyDir tmpfs; not removing",
                    ErrorClass.UNCERTAIN,
                )
            mounts.umount(volume_dir)
        raise PathInUseError(volume_dir, f"more than {_MAX_STACKED} stacked mounts")


def memory_volume_size(source: VolumeSource, allocatable: int | None) -> int | None:
    """The kubelet's calculateEmptyDirMemorySize: node allocatable memory, lowered to the
    pod's memory limit, then to sizeLimit, each only when > 0 and not larger (a sizeLimit
    above the pod's limit is ignored). None (kernel default) without any of them."""
    size = allocatable if allocatable is not None and allocatable > 0 else None
    for lower in (source.pod_memory_limit_bytes, source.size_limit_bytes):
        if lower is not None and lower > 0 and (size is None or lower <= size):
            size = lower
    return size


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
