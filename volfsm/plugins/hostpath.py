"""The hostPath plugin (kubelet's ``pkg/volume/hostpath``): a path on the node, checked.

A hostPath volume is the node's own path: nothing is mounted and nothing
is made under the root dir. The pod's path is the host path itself (the
kubelet's ``GetPath``), which the log records in the pod's ``PodAdded``
(``source.path``) and in ``VolumeMounted.mount_path``.

SetUp runs the kubelet's ``checkType`` (``os.Stat``, following symlinks):

=====================  ==========================================  =====================
type                   path missing                                path present
=====================  ==========================================  =====================
"" (unset)             fine                                        fine
``DirectoryOrCreate``  ``mkdir -p`` with mode 0755 (less umask)     must be a directory
``Directory``          "…is not a directory"                       must be a directory
``FileOrCreate``       an empty file, mode 0644 (less umask); its  must be a regular file
                       parent must exist
``File``               "…is not a file"                            must be a regular file
``Socket``             "…is not a socket file"                     must be a socket
``CharDevice``         "…is not a character device"                must be one
``BlockDevice``        "…is not a block device"                    must be one
=====================  ==========================================  =====================

Failures are FINAL, as every hostPath SetUp error is in the kubelet (the
pod-volume stays unmounted and the mount is retried with backoff), with the
kubelet's messages. A path with a ``..`` element is refused at apply and
again here.

TearDown never touches the host path: it, whatever ``*OrCreate`` made, and
anything in it stay. No fsGroup (the kubelet never applies one to a
hostPath), no stats, no block mode.

Departure from the kubelet, for reconstruction: given the root dir, SetUp
records the volume in ``pods/<uid>/volumes/kubernetes.io~host-path/<name>/
host-path.json`` (its id, path and type), so that a lost log still finds
the volume on the node; TearDown removes that file and its dir only.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from pathlib import Path, PurePosixPath

from events.types import DesiredVolume, VolumeSource
from volfsm.errors import VolfsmError
from volfsm.node.layout import PathInUseError, RootLayout, escape_plugin_name
from volfsm.plugins.base import (
    ConstructedSpec,
    ErrorClass,
    MountResult,
    NodeView,
    PluginError,
    PodVolumeDir,
    VolumePlugin,
    VolumeRequest,
)
from volfsm.plugins.csi.files import read_json, write_json

HOST_PATH_PLUGIN = "kubernetes.io/host-path"

UNSET = ""
DIRECTORY_OR_CREATE = "DirectoryOrCreate"
DIRECTORY = "Directory"
FILE_OR_CREATE = "FileOrCreate"
FILE = "File"
SOCKET = "Socket"
CHAR_DEVICE = "CharDevice"
BLOCK_DEVICE = "BlockDevice"

DIR_MODE = 0o755
FILE_MODE = 0o644
RECORD = "host-path.json"
"""The file recording a pod's hostPath volume under its pod dir (volfsm's own)."""

_KINDS: dict[str, tuple[int, str]] = {
    DIRECTORY: (stat.S_IFDIR, "a directory"),
    FILE: (stat.S_IFREG, "a file"),
    SOCKET: (stat.S_IFSOCK, "a socket file"),
    CHAR_DEVICE: (stat.S_IFCHR, "a character device"),
    BLOCK_DEVICE: (stat.S_IFBLK, "a block device"),
}
_CREATES = {DIRECTORY_OR_CREATE: DIRECTORY, FILE_OR_CREATE: FILE}
TYPES = frozenset({UNSET, *_KINDS, *_CREATES})


def _final(code: str, message: str) -> PluginError:
    return PluginError(code, message, ErrorClass.FINAL)


def _file_kind(path: str) -> int | None:
    """The file type bits of `path` (symlinks followed, as GetFileType does); None if absent."""
    try:
        return stat.S_IFMT(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise _final(errno.errorcode.get(exc.errno or 0, "OSError"), f"{path}: {exc}") from None


def check_type(path: str, path_type: str) -> str:
    """The kubelet's checkType on `path`; what it did ("" if it only checked).

    `PluginError` (FINAL) with the kubelet's message when the check fails.
    """
    if ".." in PurePosixPath(path).parts:
        raise _final("InvalidArgument", f"invalid HostPath `{path}`: must not contain '..'")
    if not path.startswith("/"):
        raise _final("InvalidArgument", f"invalid HostPath `{path}`: not an absolute path")
    if path_type == UNSET:
        return ""
    kind = _file_kind(path)
    if path_type in _CREATES:
        if kind is None:
            return _make_dir(path) if path_type == DIRECTORY_OR_CREATE else _make_file(path)
        path_type = _CREATES[path_type]
    wanted = _KINDS.get(path_type)
    if wanted is None:
        raise _final("InvalidArgument", f"{path_type} is an invalid volume type")
    if kind != wanted[0]:
        raise _final(
            "HostPathTypeMismatch", f"hostPath type check failed: {path} is not {wanted[1]}"
        )
    return ""


def _make_dir(path: str) -> str:
    try:
        os.makedirs(path, DIR_MODE, exist_ok=True)
    except OSError as exc:
        raise _final(
            errno.errorcode.get(exc.errno or 0, "OSError"), f"mkdir {path}: {exc.strerror}"
        ) from None
    return f"created directory {path}"


def _make_file(path: str) -> str:
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        code = errno.errorcode.get(exc.errno or 0, "OSError")
        raise _final(code, f"creating {path}: {exc.strerror}") from None
    os.close(fd)
    return f"created file {path}"


class HostPathPlugin(VolumePlugin):
    """kubernetes.io/host-path: the node's path, type-checked; never removed."""

    name = HOST_PATH_PLUGIN
    pod_path_outside_root = True

    def __init__(self, layout: RootLayout | None = None) -> None:
        self.layout = layout
        """The root dir the volumes are recorded in (None: not recorded)."""

    def supports(self, source: VolumeSource) -> bool:
        """Whether `source` is a hostPath (a pod's or a PV's)."""
        return source.plugin == self.name

    def can_serve(self, source: VolumeSource, volume_mode: str) -> str | None:
        """Filesystem mode and a known type (the path is checked by SetUp)."""
        problem = super().can_serve(source, volume_mode)
        if problem is not None:
            return problem
        if source.path_type not in TYPES:
            return f"{source.path_type} is an invalid volume type"
        return None

    def pod_mount_path(self, root: Path, req: VolumeRequest) -> Path:
        """The host path itself (the kubelet's GetPath)."""
        return Path(req.source.path)

    def expected_pod_mount(self, spec: DesiredVolume) -> str | None:
        """Nothing is mounted for a hostPath."""
        return ""

    def spec_from_volume_id(self, volume_id: str, pod_uid: str, name: str) -> DesiredVolume | None:
        """A hostPath volume's spec from its id, without the path (its teardown needs none)."""
        if not volume_id.startswith(f"{HOST_PATH_PLUGIN}/"):
            return None
        source = VolumeSource(plugin=HOST_PATH_PLUGIN)
        return DesiredVolume(name=name, volume_id=volume_id, source=source)

    def construct_volume_spec(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | str:
        """A pod's hostPath volume from the record SetUp left in its pod dir."""
        if not entry.is_dir:
            return f"{entry.path} is not a directory: no hostPath record dir"
        data = read_json(layout, entry.path / RECORD)
        if isinstance(data, str):
            return f"no usable hostPath record: {data}"
        path, volume_id = data.get("path", ""), data.get("volumeId", "")
        if not path or not volume_id.startswith(f"{HOST_PATH_PLUGIN}/"):
            return f"{entry.path / RECORD} names no hostPath volume"
        source = VolumeSource(plugin=HOST_PATH_PLUGIN, path=path, path_type=data.get("type", ""))
        spec = DesiredVolume(
            name=entry.name, volume_id=volume_id, source=source, pv_name=data.get("pvName", "")
        )
        return ConstructedSpec(spec, note=f"hostPath {path}, recorded in {RECORD}")

    def _record_dir(self, req: VolumeRequest) -> Path | None:
        """pods/<uid>/volumes/kubernetes.io~host-path/<name>; None if volfsm keeps no record."""
        if self.layout is None or not req.pod_uid or not req.volume_name:
            return None
        return self.layout.pod_volume_dir(
            req.pod_uid, escape_plugin_name(self.name), req.volume_name
        )

    def _write_record(self, req: VolumeRequest) -> None:
        where = self._record_dir(req)
        if where is None or self.layout is None:
            return
        record = {"volumeId": req.volume_id, "path": req.source.path, "type": req.source.path_type}
        if not req.ephemeral:
            record["pvName"] = req.spec_name
        try:
            write_json(self.layout, where / RECORD, record)
        except (VolfsmError, OSError) as exc:
            raise PluginError(
                "RecordFailed", f"{where / RECORD}: {exc}", ErrorClass.UNCERTAIN
            ) from None

    def _remove_record(self, req: VolumeRequest) -> str | None:
        """Remove the record and its dir; what stayed (anything else in it), or None."""
        where = self._record_dir(req)
        if where is None or self.layout is None:
            return None
        try:
            with self.layout.open_dir(where) as fd, contextlib.suppress(FileNotFoundError):
                os.unlink(RECORD, dir_fd=fd)
            self.layout.remove_dir(where)
        except FileNotFoundError:
            return None
        except PathInUseError as exc:
            return f"kept: {where}: {exc.reason} (not volfsm's)"
        except (VolfsmError, OSError) as exc:
            raise PluginError("TearDownFailed", f"{where}: {exc}", ErrorClass.UNCERTAIN) from None
        return None

    async def set_up(self, req: VolumeRequest) -> MountResult:
        """The type check (creating the path for the *OrCreate types), then the record."""
        done = await asyncio.to_thread(check_type, req.source.path, req.source.path_type)
        await asyncio.to_thread(self._write_record, req)
        detail = done or f"hostPath {req.source.path} ({req.source.path_type or 'no type check'})"
        return MountResult(path=req.source.path, mount_found=None, detail=detail)

    async def tear_down(self, req: VolumeRequest) -> str | None:
        """Only the record goes: the host path stays as it is."""
        return await asyncio.to_thread(self._remove_record, req)
