"""Orphan cleanup: what reconstruction could not rebuild, removed once, directories only.

An orphan is something under the root dir no plugin can vouch for: an
unknown plugin's dir, an entry its plugin cannot rebuild a spec from (a CSI
dir without a usable ``vol_data.json``), a file where a directory belongs,
an empty leftover (see `volfsm.engine.reconstruct`). A mounted volume whose
plugin can read it back from the node is not an orphan: it is reconstructed
and torn down by its plugin (NodeUnpublish, NodeUnstage) like any volume.

Once the desired state is complete and no desired pod wants it, each orphan
is cleaned up once (`OrphanCleaner`):

1. every mount at or under it is unmounted with a plain umount (not lazy:
   a busy mount fails and is reported); an unmount leaves the mounted
   source's data as it is;
2. its empty directories are removed bottom up, on one filesystem
   (`volfsm.node.dirsonly.remove_dirs`). A file, symlink, socket, fifo or device
   node is kept, and so is anything on another filesystem.

The attempt is recorded as an `orphan_cleanup` operation on the pod-volume
stream named by the dir (pod dirs) or on ``device/orphan:<path>`` (plugin
dirs). Its outcome:

* everything went: OperationSucceeded, status "cleaned";
* something was kept: OperationFailed, final, code "KeptFiles", the message
  naming the first things kept; status "kept", with the list in `stayed`.
  A failure, not a success with a count: the orphan is still on the node,
  and whoever reads the log, `volfsm get volumes` or the analytics must see
  that it is, and why;
* an unmount or a directory failed (EBUSY, EPERM, ...): OperationFailed,
  final, the errno name; status "failed".

Nothing is retried until the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec
from loguru import logger as log

from events.types import (
    DesiredVolume,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
)
from volfsm.engine.handler import CommandHandler
from volfsm.engine.operations import OperationGenerator
from volfsm.errors import VolfsmError
from volfsm.node import mounts
from volfsm.node.dirsonly import DirsRemoval, remove_dirs
from volfsm.node.layout import (
    PathInUseError,
    RootLayout,
    UnsafePathError,
    unescape_plugin_name,
)

ORPHAN_CLEANUP = "orphan_cleanup"
"""Operation name of the one-shot cleanup of what could not be reconstructed."""
ORPHAN_STREAM_PREFIX = "orphan:"
"""Device streams of plugin-dir orphans are ``device/orphan:<path below the root>``."""
KEPT_FILES = "KeptFiles"
"""OperationFailed code of a cleanup that kept what volfsm did not create."""
NOT_OURS = ", not volfsm's"

Outcome = OperationFailed | OperationSucceeded

EntryKey = tuple[str, str, str, str]
"""(pod uid, "volumes" or "volumeDevices", escaped plugin name, dir name): one pod volume dir."""


@dataclass
class Orphan:
    """Something on the node that could not be reconstructed, and what became of it."""

    path: str
    why: str
    """Why it could not be reconstructed."""
    stream: str
    """Where its cleanup is recorded."""
    pod_uid: str = ""
    """The pod dir it is in ("" for a plugin dir)."""
    entry: EntryKey | None = None
    plugin: str = ""
    """The plugin whose global dir holds it ("" in a pod dir, or outside any plugin's)."""
    status: str = "pending"
    """pending (until the desired state is complete); kept (a desired pod wants it, or
    the cleanup kept what volfsm did not create: see `stayed`); cleaned; or failed."""
    error: str = ""
    """Why the cleanup failed, or why it was kept."""
    stayed: list[str] = field(default_factory=list)
    """What the cleanup kept, one "kept: <path>: <what>" line each (the first ones)."""
    stayed_count: int = 0

    def as_dict(self) -> dict[str, object]:
        """What `volfsm get` shows."""
        out: dict[str, object] = {
            "path": self.path,
            "why": self.why,
            "status": self.status,
            "stream": self.stream,
        }
        if self.error:
            out["error"] = self.error
        if self.stayed_count:
            out["stayed"] = list(self.stayed)
            out["stayed_count"] = self.stayed_count
        return out


class DesiredPods(Protocol):
    """What reconstruction and orphan cleanup read from the DSW."""

    pods: dict[str, PodAdded]

    def volumes_to_mount(self) -> list[tuple[PodAdded, DesiredVolume]]:
        """Every desired (pod, volume)."""


class PodDirQueue(Protocol):
    """Who removes pod dirs (the reconciler)."""

    def queue_pod_cleanup(self, uid: str) -> None:
        """Remove the pod's dir once it holds nothing and is not desired."""

    def wake(self) -> None:
        """Run a pass now."""

    def volume_spec(self, volume_id: str) -> DesiredVolume | None:
        """A volume's spec (from the log, else as reconstruction rebuilt it)."""


EntriesOf = Callable[[str, DesiredVolume], set[EntryKey]]
"""The pod volume dirs a desired pod's volume can live in."""


class OrphanCleaner:
    """The one-shot cleanup of a reconstruction's orphans (see the module doc)."""

    def __init__(
        self,
        *,
        handler: CommandHandler,
        dsw: DesiredPods,
        ops: OperationGenerator,
        layout: RootLayout,
        registry: PodDirQueue,
        entries_of: EntriesOf,
    ) -> None:
        self.handler = handler
        self.dsw = dsw
        self.ops = ops
        self.layout = layout
        self.registry = registry
        self.entries_of = entries_of
        self._task: asyncio.Task[None] | None = None
        self._ids = 0
        self._id_prefix = os.urandom(4).hex()

    def start(self, orphans: list[Orphan]) -> None:
        """Clean `orphans` up in a task, once (later calls do nothing)."""
        if not orphans or self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(
            self._clean_all(orphans), name="volfsm-orphan-cleanup"
        )

    async def wait(self) -> None:
        """Wait for a running cleanup (stop, tests)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def wanted(self, orphan: Orphan) -> str:
        """Why what is at the orphan's path is still wanted, or "" if nothing wants it."""
        return self._desired(orphan) or self._in_use(orphan)

    def _in_use(self, orphan: Orphan) -> str:
        """Why an operation running now may be using the orphan's path ("" if none is).

        A pod deleted while its mount is in flight leaves the mount running: its
        staging dir, say, is no desired pod's but NodeStage is creating it. The
        operation owns the path; what it leaves is torn down when it ends.
        """
        prefix = orphan.path + "/"
        for key in self.ops.executor.pending.running_keys():
            if orphan.pod_uid and key.pod == orphan.pod_uid:
                return f"an operation on its pod is running ({key.volume_id})"
            spec = self.registry.volume_spec(key.volume_id)
            paths = self.ops.request_paths(spec, "") if spec is not None else None
            device = paths[0] if paths is not None else None
            if device is not None and (os.fspath(device) + "/").startswith(prefix):
                return f"an operation on {key.volume_id} is running there"
        return ""

    def _desired(self, orphan: Orphan) -> str:
        """Why a desired pod wants what is at the orphan's path, or "" if none does."""
        if orphan.pod_uid:
            pod = self.dsw.pods.get(orphan.pod_uid)
            if pod is None:
                return ""
            if orphan.entry is None:
                # A leftover dir of a desired pod (e.g. an empty volumes/<plugin>): its
                # mounts may be creating entries under it right now.
                return "its pod is desired: the pod's own cleanup removes it when the pod goes"
            if any(orphan.entry in self.entries_of(orphan.pod_uid, dv) for dv in pod.volumes):
                return "a desired pod wants it: its mount may rebuild it"
            return ""
        prefix = orphan.path + "/"
        for _, dv in self.dsw.volumes_to_mount():
            paths = self.ops.request_paths(dv, "")
            device = paths[0] if paths is not None else None
            if device is not None and os.fspath(device).startswith(prefix):
                return "a desired pod wants it: its mount may rebuild it"
        return ""

    async def _clean_all(self, orphans: list[Orphan]) -> None:
        for orphan in orphans:
            if orphan.status != "pending":
                continue
            wanted = self.wanted(orphan)
            if wanted:
                orphan.status = "kept"
                orphan.error = wanted
                log.info("orphan {} kept: {}", orphan.path, orphan.error)
                continue
            await self._clean(orphan)
        for orphan in orphans:
            if orphan.pod_uid and orphan.pod_uid not in self.dsw.pods:
                self.registry.queue_pod_cleanup(orphan.pod_uid)
        self.registry.wake()

    def _next_id(self) -> str:
        self._ids += 1
        return f"{self._id_prefix}-r{self._ids}"

    async def _clean(self, orphan: Orphan) -> None:
        op_id = self._next_id()
        started = time.monotonic()
        plugin = unescape_plugin_name(orphan.entry[2]) if orphan.entry is not None else ""
        begin = OperationStarted(
            op_id=op_id,
            operation=ORPHAN_CLEANUP,
            volume_id="",
            pod_uid=orphan.pod_uid,
            plugin=plugin,
            reason=f"could not be reconstructed ({orphan.why}); no desired pod wants it",
        )
        await self.handler.record_async(orphan.stream, [begin])
        try:
            result = await asyncio.to_thread(self._remove, orphan)
        except (VolfsmError, OSError) as exc:
            status, end = self._failed(orphan, op_id, _error_code(exc), str(exc))
        else:
            status, end = self._outcome(orphan, op_id, result)
        end = msgspec.structs.replace(end, duration_s=round(time.monotonic() - started, 6))
        await self.handler.record_async(orphan.stream, [end])
        orphan.status = status  # only once the outcome is in the log (and `get` shows it)

    def _outcome(self, orphan: Orphan, op_id: str, result: DirsRemoval) -> tuple[str, Outcome]:
        """(status, record) of a removal that ran."""
        orphan.stayed = result.lines(NOT_OURS)
        orphan.stayed_count = result.kept_count
        if result.error is not None:
            why = f"{result.error_path}: {result.error.strerror or result.error}"
            return self._failed(orphan, op_id, _error_code(result.error), why)
        if result.kept_count:
            count = result.kept_count
            orphan.error = f"{count} {'entry' if count == 1 else 'entries'} volfsm did not create"
            log.warning("orphan {} ({}) cleaned up, but {}", orphan.path, orphan.why, orphan.error)
            return "kept", OperationFailed(
                op_id=op_id,
                operation=ORPHAN_CLEANUP,
                code=KEPT_FILES,
                message=f"{orphan.path} stays: {result.summary(NOT_OURS)}",
                final=True,
            )
        log.info("orphan {} cleaned up ({})", orphan.path, orphan.why)
        return "cleaned", OperationSucceeded(op_id=op_id, operation=ORPHAN_CLEANUP)

    def _failed(self, orphan: Orphan, op_id: str, code: str, why: str) -> tuple[str, Outcome]:
        orphan.error = why
        log.error("orphan {} could not be cleaned up ({}); it stays: {}", orphan.path,
                  orphan.why, why)  # fmt: skip
        return "failed", OperationFailed(
            op_id=op_id,
            operation=ORPHAN_CLEANUP,
            code=code,
            message=f"{orphan.path} stays: {why}",
            final=True,
        )

    def _remove(self, orphan: Orphan) -> DirsRemoval:
        """Unmount what is mounted at or under the path (plain umount), then remove its
        empty directories (no symlink followed, no file removed, one filesystem)."""
        path = Path(orphan.path)
        self.layout.resolve_inside(path.parent)
        for info in mounts.mounts_under(path):
            mounts.umount(info.mount_point)
        result = remove_dirs(self.layout, path)
        stop = self._stop_at(orphan)
        if result.gone and stop is not None and path.parent != stop:
            # a parent still holding other entries stays
            with contextlib.suppress(VolfsmError, OSError):
                self.layout.remove_dir(path.parent, stop_at=stop)
        return result

    def _stop_at(self, orphan: Orphan) -> Path | None:
        """Up to where empty parents go: its pod dir, or its plugin's global dir."""
        with contextlib.suppress(UnsafePathError):
            if orphan.pod_uid:
                return self.layout.pod_dir(orphan.pod_uid)
            if orphan.plugin:
                return self.layout.plugin_dir(orphan.plugin)
        return None


def _error_code(exc: BaseException) -> str:
    """A short code for an orphan cleanup failure: the errno name, or the error's kind."""
    if isinstance(exc, mounts.MountError):
        return exc.code
    if isinstance(exc, PathInUseError):
        return "PathInUse"
    if isinstance(exc, UnsafePathError):
        return "UnsafePath"
    if isinstance(exc, OSError) and exc.errno:
        return errno.errorcode.get(exc.errno, "OSError")
    return type(exc).__name__


__all__ = [
    "KEPT_FILES",
    "ORPHAN_CLEANUP",
    "ORPHAN_STREAM_PREFIX",
    "DesiredPods",
    "Orphan",
    "OrphanCleaner",
]
