"""The configMap, secret, downwardAPI and projected plugins (kubelet §1).

Each wraps a volume dir as the kubelet wraps an emptyDir
(``pods/<uid>/volumes/kubernetes.io~<kind>/<name>``): a plain directory for
configMap, a tmpfs for secret, downwardAPI and projected (Secret values and
tokens never touch the node's disk) sized as the kubelet sizes that memory
emptyDir (the pod's memory limit, else the node's allocatable memory), then
fills it with the `AtomicWriter`.
SetUp reads the objects from the node's object store; called again for a
remount (the kubelet's RequiresRemount: a changed ConfigMap, Secret, pod
label or a token due for refresh) it rewrites only what changed, in one
atomic swap.

SetUp errors. A missing object or key, a bad item path or a token that
cannot be had is found before the node is touched: TRANSIENT (the pod
waits, the reason in its status, retried with backoff; a mounted volume
keeps its old content, as in the kubelet). A failure writing the files
after the dir or tmpfs is there is UNCERTAIN (torn down later).

Reconstruction: a dir under ``kubernetes.io~<kind>/`` is this plugin's
volume of that name (its id ``<plugin>/<uid>-<name>``); its content comes
back on the next SetUp, from the store.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache, lru_cache, partial
from pathlib import Path

import msgspec

from events.types import DesiredVolume, VolumeSource
from volfsm.desired.objects import Pod
from volfsm.desired.resolve import pod_memory_limit
from volfsm.desired.volumes import Volume
from volfsm.node import mounts
from volfsm.node.atomicwriter import (
    AtomicWriteError,
    AtomicWriter,
    DirReaper,
    check_payload,
)
from volfsm.node.beneath import TMPFS_MAGIC, filesystem_magic, open_dir_beneath
from volfsm.node.dirsonly import first_kept, remove_dirs
from volfsm.node.layout import PathInUseError, RootLayout, UnsafePathError
from volfsm.node.ownership import OwnershipResult, set_volume_ownership
from volfsm.objects import ObjectStore
from volfsm.plugins.base import (
    FILESYSTEM,
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
from volfsm.plugins.emptydir import memory_volume_size
from volfsm.plugins.objectvol.certs import CertManager
from volfsm.plugins.objectvol.payload import Context, PayloadError, volume_payload
from volfsm.plugins.objectvol.tokens import TokenManager
from volfsm.plugins.objectvol.workers import Workers

CONFIG_MAP_PLUGIN = "kubernetes.io/configmap"
SECRET_PLUGIN = "kubernetes.io/secret"
DOWNWARD_API_PLUGIN = "kubernetes.io/downward-api"
PROJECTED_PLUGIN = "kubernetes.io/projected"
OBJECT_PLUGINS = (CONFIG_MAP_PLUGIN, SECRET_PLUGIN, DOWNWARD_API_PLUGIN, PROJECTED_PLUGIN)
VOLUME_DIR_MODE = 0o777
MAX_STACKED = 16
SETUP_THREADS = 4
PATH_CACHE_SIZE = 8192
"""Threads for the plugins' SetUps (file work and token or certificate commands)."""
KEPT_OWNER = " the log did not create"

RemountAt = Callable[[str, str, float], None]
"""(pod uid, volume name, unix time): ask for a remount then (a token due for refresh)."""


@dataclass
class ObjectVolumes:
    """What the four plugins share: the store (set once the engine has one), tokens, resources."""

    store: ObjectStore | None = None
    tokens: TokenManager | None = None
    certs: CertManager | None = None
    allocatable: Mapping[str, Fraction] = field(default_factory=dict)
    remount_at: RemountAt | None = None
    reaper: DirReaper = field(default_factory=DirReaper)
    """Removes the payload dirs a rewrite replaced, off the rewrite's path."""


@cache
def setup_workers() -> Workers:
    """The process's threads for object-volume SetUps (made on first use)."""
    return Workers(SETUP_THREADS, "volfsm-objects")


@lru_cache(maxsize=PATH_CACHE_SIZE)
def _pod_volume_dir(layout: RootLayout, uid: str, escaped_plugin: str, name: str) -> Path:
    """`RootLayout.pod_volume_dir`, remembered: each remount asks again (in the engine and
    in SetUp), and checking every component of the path each time is not free."""
    return layout.pod_volume_dir(uid, escaped_plugin, name)


def _tmpfs_mounted_at(dir_fd: int) -> bool:
    """Whether the dir open at `dir_fd` (walked to by path) is the root of a tmpfs mounted
    there: another device than its parent's, and a tmpfs. What `find_mount` says for every
    remount of a mounted volume, without reading and parsing mountinfo (about 0.3 ms with
    a few dozen mounts, more with a pod's worth each); anything else asks `find_mount`."""
    try:
        own = os.fstat(dir_fd).st_dev
        parent = os.stat("..", dir_fd=dir_fd, follow_symlinks=False).st_dev
    except OSError:
        return False
    return own != parent and filesystem_magic(dir_fd) == TMPFS_MAGIC


def object_volume_id(plugin: str, pod_uid: str, name: str) -> str:
    """The unique volume id of a pod's object volume (as `resolve` gives it)."""
    return f"{plugin}/{pod_uid}-{name}"


def find_pod(store: ObjectStore, uid: str, namespace: str = "", name: str = "") -> Pod | None:
    """The stored Pod with this uid, or None; looked up by `namespace`/`name` when given."""
    named = store.get("Pod", namespace, name) if name else None
    if named is not None and named.uid == uid and isinstance(named.obj, Pod):
        return named.obj
    for stored in store.objects("Pod"):
        if stored.uid == uid and isinstance(stored.obj, Pod):
            return stored.obj
    return None


class ObjectVolumePlugin(VolumePlugin):
    """One of the four object plugins; `memory` says whether its dir is a tmpfs."""

    memory = True
    walks_pod_path = True  # `_wrap`: `RootLayout.ensure_dir` before anything is written

    def __init__(self, layout: RootLayout, shared: ObjectVolumes) -> None:
        self.layout = layout
        self.shared = shared
        self._layouts: dict[Path, RootLayout] = {layout.root: layout}
        self._dir_name = super().pod_dir_name()

    def pod_dir_name(self) -> str:
        """The escaped plugin name (worked out once: each remount asks, twice)."""
        return self._dir_name

    def supports(self, source: VolumeSource) -> bool:
        """Whether `source` is of this plugin."""
        return source.plugin == self.name

    def can_serve(self, source: VolumeSource, volume_mode: str) -> str | None:
        """Filesystem volumes only."""
        if volume_mode != FILESYSTEM:
            return f"plugin {self.name} serves volumeMode Filesystem only"
        return None

    def requires_remount(self, source: VolumeSource) -> bool:
        """The kubelet's RequiresRemount: true, the files follow their objects."""
        return True

    # --------------------------------------------------------- reconstruction

    def construct_volume_spec(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | str:
        """The volume from its dir's name (its content comes from the store at SetUp)."""
        if not entry.is_dir:
            return f"a {self.name} entry that is not a directory"
        spec = self.spec_from_volume_id(
            object_volume_id(self.name, entry.pod_uid, entry.name), entry.pod_uid, entry.name
        )
        assert spec is not None
        return ConstructedSpec(spec)

    def spec_from_volume_id(self, volume_id: str, pod_uid: str, name: str) -> DesiredVolume | None:
        """The pod's volume `name` if `volume_id` is its id."""
        if volume_id != object_volume_id(self.name, pod_uid, name):
            return None
        return DesiredVolume(name=name, volume_id=volume_id, source=VolumeSource(plugin=self.name))

    def expected_pod_mount(self, spec: DesiredVolume) -> str | None:
        """A tmpfs for secret, downwardAPI and projected; nothing for configMap."""
        return f"{self.name} tmpfs" if self.memory else ""

    # ------------------------------------------------------------------ paths

    def pod_mount_path(self, root: Path, req: VolumeRequest) -> Path:
        """pods/<uid>/volumes/kubernetes.io~<kind>/<name>."""
        layout = self._layouts.get(root)
        if layout is None:
            layout = self._layouts[root] = RootLayout(root)
        return _pod_volume_dir(layout, req.pod_uid, self.pod_dir_name(), req.volume_name)

    def _volume_dir(self, req: VolumeRequest) -> Path:
        try:
            return _pod_volume_dir(self.layout, req.pod_uid, self.pod_dir_name(), req.volume_name)
        except UnsafePathError as exc:
            raise PluginError("UnsafePath", str(exc), ErrorClass.TRANSIENT) from None

    # ----------------------------------------------------------------- set up

    async def set_up(self, req: VolumeRequest) -> MountResult:
        """Fill the volume from the store (again, for a remount). Idempotent.

        Runs on the plugins' own few threads (`SETUP_THREADS`): a burst of
        remounts (a ConfigMap 100 pods use) does not crowd the event loop
        and each other out of the GIL.
        """
        return await setup_workers().run(partial(self._set_up, req))

    def _context(self, req: VolumeRequest) -> tuple[Context, Volume]:
        store = self.shared.store
        if store is None:
            raise PluginError("NotReady", "the object store is not open yet", ErrorClass.TRANSIENT)
        pod = find_pod(store, req.pod_uid, req.pod_namespace, req.pod_name)
        if pod is None:
            raise PluginError(
                "PodNotFound", f"pod {req.pod_uid} is not in the object store", ErrorClass.TRANSIENT
            )
        for volume in pod.spec.volumes:
            if volume.name == req.volume_name:
                shared = self.shared
                ctx = Context(store, pod, shared.tokens, shared.allocatable, shared.certs)
                return ctx, volume
        raise PluginError(
            "VolumeNotFound",
            f"{pod.label} has no volume {req.volume_name!r}",
            ErrorClass.TRANSIENT,
        )

    def _set_up(self, req: VolumeRequest) -> MountResult:
        volume_dir = self._volume_dir(req)
        ctx, volume = self._context(req)
        meta = ctx.pod.metadata
        where = f"pod {meta.ns}/{meta.name} volume {volume.name}"
        try:
            payload = volume_payload(ctx, volume)
            check_payload(payload.files)
        except PayloadError as exc:
            raise PluginError(exc.code, f"{where}: {exc}", ErrorClass.TRANSIENT) from None
        except AtomicWriteError as exc:
            raise PluginError("InvalidPath", f"{where}: {exc}", ErrorClass.TRANSIENT) from None
        dir_fd, mount_found = self._wrap(volume_dir, lambda: self._tmpfs_size(req, ctx.pod))
        owned: list[OwnershipResult] = []

        def set_perms(top: Path) -> None:
            # the kubelet's SetVolumeOwnership with the mounter's ReadOnly attribute (0440 bits)
            owned.append(set_volume_ownership(top, req.fs_group, read_only=True))

        perms = set_perms if req.fs_group is not None else None
        try:
            writer = AtomicWriter(volume_dir, context=where, retire=self.shared.reaper.retire)
            result = writer.write(payload.files, perms, dir_fd=dir_fd)
        except (AtomicWriteError, OSError) as exc:
            raise PluginError("WriteFailed", str(exc), ErrorClass.UNCERTAIN) from None
        finally:
            os.close(dir_fd)
        if payload.refresh_at is not None and self.shared.remount_at is not None:
            self.shared.remount_at(req.pod_uid, req.volume_name, payload.refresh_at)
        change = "written" if result.written else "unchanged"
        detail = f"{change} {result.data_dir}"
        if result.kept:
            detail += f"; kept {', '.join(result.kept)}: a mount is inside it"
        return MountResult(
            path=str(volume_dir),
            mount_found=mount_found,
            detail=detail,
            contents=f"{change}: {payload.describe()}",
            ownership=owned[0].summary() if owned else "",
            ownership_s=owned[0].duration_s if owned else 0.0,
        )

    def _tmpfs_size(self, req: VolumeRequest, pod: Pod) -> int | None:
        """The size of the kubelet's wrapped memory emptyDir (no sizeLimit): the pod's memory
        limit, else the node's allocatable memory (`memory_volume_size`)."""
        memory = self.shared.allocatable.get("memory")
        wrapped = msgspec.structs.replace(
            req.source, pod_memory_limit_bytes=pod_memory_limit(pod), size_limit_bytes=None
        )
        return memory_volume_size(wrapped, int(memory) if memory else None)

    def _wrap(self, volume_dir: Path, size: Callable[[], int | None]) -> tuple[int, bool | None]:
        """The wrapped emptyDir: the dir, with a tmpfs of `size()` bytes for the memory plugins
        (an existing tmpfs is kept as it is, as the kubelet's wrapper does; the size is worked
        out only for a new one). Returns an fd of the dir to write in (walked to following no
        symlink; the caller closes it) and whether the tmpfs was found mounted."""
        fd = self._open_volume_dir(volume_dir)
        try:
            # the permission bits only, as the kubelet's emptyDir setupDir compares them
            # (Perm()): the setgid bit an fsGroup pass set stays when nothing is rewritten
            if os.fstat(fd).st_mode & 0o777 != VOLUME_DIR_MODE:
                os.fchmod(fd, VOLUME_DIR_MODE)
            if not self.memory:
                return fd, None
            if _tmpfs_mounted_at(fd):
                return fd, True  # a remount: no read of mountinfo
            existing = mounts.find_mount(volume_dir)
        except OSError as exc:
            os.close(fd)
            raise os_error(exc, f"creating {volume_dir}", ErrorClass.FINAL) from None
        except BaseException:
            os.close(fd)
            raise
        if existing is not None:
            if existing.fstype != "tmpfs":
                os.close(fd)
                raise PluginError(
                    "MediumMismatch",
                    f"{volume_dir} is a {existing.fstype} mount, not tmpfs",
                    ErrorClass.UNCERTAIN,
                )
            return fd, True
        os.close(fd)
        try:
            with self.layout.pin(volume_dir) as target:
                mounts.mount_tmpfs(target, size())
        except UnsafePathError as exc:
            raise PluginError("UnsafePath", str(exc), ErrorClass.TRANSIENT) from None
        except mounts.MountError as exc:
            raise PluginError(exc.code, str(exc), ErrorClass.FINAL) from None
        found = mounts.find_mount(volume_dir)
        return self._open_volume_dir(volume_dir), found is not None and found.fstype == "tmpfs"

    def _open_volume_dir(self, volume_dir: Path) -> int:
        """The volume dir's fd, made (with its parents) if missing, following no symlink:
        in one `openat2` when it exists (`open_dir_beneath`), else by `RootLayout`'s walk."""
        root = os.fspath(self.layout.root)
        try:
            root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            pass
        else:
            try:
                fd = open_dir_beneath(root_fd, os.fspath(volume_dir)[len(root) + 1 :])
            finally:
                os.close(root_fd)
            if fd is not None:
                return fd
        try:
            with self.layout.open_dir(volume_dir, create=True) as fd:
                return os.dup(fd)
        except UnsafePathError as exc:
            raise PluginError("UnsafePath", str(exc), ErrorClass.TRANSIENT) from None
        except OSError as exc:
            raise os_error(exc, f"creating {volume_dir}", ErrorClass.FINAL) from None

    # --------------------------------------------------------------- tear down

    async def tear_down(self, req: VolumeRequest) -> str | None:
        """Unmount the tmpfs and remove the dir (with `keep_files`: directories only)."""
        return await asyncio.to_thread(self._tear_down, req)

    def _tear_down(self, req: VolumeRequest) -> str | None:
        volume_dir = self._volume_dir(req)
        self.shared.reaper.settle(volume_dir)  # the teardown removes what it had queued
        if self.shared.tokens is not None:
            self.shared.tokens.forget_pod(req.pod_uid)
        if self.shared.certs is not None:
            self.shared.certs.forget_pod(req.pod_uid)
        with teardown_errors(volume_dir):
            if req.keep_files:
                return self._tear_down_keeping(volume_dir)
            self._unmount(volume_dir)
            self.layout.remove_tree(volume_dir)
        return None

    def _unmount(self, volume_dir: Path) -> None:
        """Unmount the tmpfs at the dir (each layer, should two SetUps have raced)."""
        for _ in range(MAX_STACKED):
            found = mounts.find_mount(volume_dir)
            if found is None:
                return
            if found.fstype != "tmpfs":
                raise PluginError(
                    "MediumMismatch",
                    f"{volume_dir} is a {found.fstype} mount, not this plugin's tmpfs; "
                    "not removing",
                    ErrorClass.UNCERTAIN,
                )
            mounts.umount(volume_dir)
        raise PathInUseError(volume_dir, f"more than {MAX_STACKED} stacked mounts")

    def _tear_down_keeping(self, volume_dir: Path) -> str | None:
        """A volume the log did not create: files stay (and a tmpfs holding any stays mounted)."""
        found = mounts.find_mount(volume_dir)
        if found is not None and found.fstype == "tmpfs":
            held = first_kept(self.layout, volume_dir)
            if held is not None:
                return f"the tmpfs at {volume_dir} stays mounted: it holds {held.text()}"
            mounts.umount(volume_dir)
        removal = remove_dirs(self.layout, volume_dir)
        return None if removal.gone else removal.summary(KEPT_OWNER)


class ConfigMapPlugin(ObjectVolumePlugin):
    """kubernetes.io/configmap: a ConfigMap's keys as files, on the node's disk."""

    name = CONFIG_MAP_PLUGIN
    memory = False


class SecretPlugin(ObjectVolumePlugin):
    """kubernetes.io/secret: a Secret's values as files, on a tmpfs only."""

    name = SECRET_PLUGIN


class DownwardAPIPlugin(ObjectVolumePlugin):
    """kubernetes.io/downward-api: the pod's metadata and resources as files."""

    name = DOWNWARD_API_PLUGIN


class ProjectedPlugin(ObjectVolumePlugin):
    """kubernetes.io/projected: several sources (the service-account token) in one dir."""

    name = PROJECTED_PLUGIN


def object_plugins(layout: RootLayout, shared: ObjectVolumes) -> list[ObjectVolumePlugin]:
    """The four plugins, sharing `shared`."""
    return [
        cls(layout, shared)
        for cls in (ConfigMapPlugin, SecretPlugin, DownwardAPIPlugin, ProjectedPlugin)
    ]
