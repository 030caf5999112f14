"""Removing the dirs of deleted pods, directories only, once their volumes are all gone.

A pod removed from the desired state (or found on the node and not desired)
is queued (`PodDirCleaner.queue`). Once the desired state is complete and
none of its volumes is Mounted, Uncertain or busy with an operation, its dir
is removed directories only (`volfsm.node.dirsonly.remove_pod_dir`), in a
thread: a file left in it (etc-hosts, a container log, anything a volume's
teardown did not remove) is not volfsm's, so it stays, and the pod dir with
it, reported in `failures` (tried again at the next start). A pod whose dir
is gone gets `PodCleanedUp`, which makes the folds forget it.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from loguru import logger

from events.errors import VolfsmEventsError
from events.streams import pod_stream
from events.types import DesiredVolume, PodAdded, PodCleanedUp
from projections.asw import Asw
from volfsm.engine.handler import CommandHandler
from volfsm.engine.index import HOLDING, EngineIndex
from volfsm.engine.pending import NestedPendingOperations
from volfsm.errors import VolfsmError
from volfsm.node.dirsonly import remove_pod_dir
from volfsm.node.layout import RootLayout

log = logger.bind(logger_name="volfsm.engine.reconciler")

KEPT_OWNER = " volfsm did not create"
"""Said of each file a deleted pod's dir keeps: "kept: <path>: a file volfsm did not create"."""


class DesiredPods(Protocol):
    """The pods the desired state holds."""

    pods: dict[str, PodAdded]


class PodDirCleaner:
    """Queued pods whose dirs go once nothing of theirs is held (see the module doc)."""

    def __init__(
        self,
        *,
        asw: Asw,
        dsw: DesiredPods,
        index: EngineIndex,
        pending: NestedPendingOperations,
        layout: RootLayout,
        recorder: CommandHandler,
        reconstructed: dict[tuple[str, str], DesiredVolume],
    ) -> None:
        self.asw = asw
        self.dsw = dsw
        self.index = index
        self.pending = pending
        self.layout = layout
        self.recorder = recorder
        self.reconstructed = reconstructed
        """Specs reconstruction rebuilt (the reconciler's dict): their pods hold them too."""
        self.failures: dict[str, str] = {}
        """uid -> why the pod's dir could not be removed (until it is)."""
        self._queued: dict[str, None] = {}
        self._task: asyncio.Task[None] | None = None

    def queue(self, uid: str) -> None:
        """The pod is gone from the desired state: remove its dir once it holds nothing."""
        self._queued[uid] = None

    def clean(self) -> None:
        """Start removing the dirs of queued pods that hold nothing (call with the gate open)."""
        if not self._queued or (self._task is not None and not self._task.done()):
            return
        ready: list[str] = []
        for uid in list(self._queued):
            if uid in self.dsw.pods:
                del self._queued[uid]
            elif not self.pod_holds_any(uid) and not self._pod_busy(uid):
                del self._queued[uid]
                self.index.forget_pod(uid)
                ready.append(uid)
        if ready:
            self._task = asyncio.get_running_loop().create_task(self._clean_and_record(ready))

    async def wait(self) -> None:
        """Wait for a running cleanup (stop, tests)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def pod_holds_any(self, uid: str) -> bool:
        """Whether any of the pod's volumes (reconstructed ones too) is Mounted or Uncertain."""
        podvols = self.asw.podvols
        pod = self.index.pod_spec(uid)
        for dv in pod.volumes if pod is not None else ():
            pv = podvols.get((uid, dv.name))
            if pv is not None and pv.state in HOLDING:
                return True
        if self.reconstructed:
            for key in self.reconstructed:
                if key[0] == uid:
                    pv = podvols.get(key)
                    if pv is not None and pv.state in HOLDING:
                        return True
        return False

    def _pod_busy(self, uid: str) -> bool:
        pod = self.index.pod_spec(uid)
        if pod is None:
            return False
        return any(self.pending.is_operation_pending(dv.volume_id, uid) for dv in pod.volumes)

    async def _clean_and_record(self, uids: list[str]) -> None:
        """Remove the pod dirs; record `PodCleanedUp` for each pod whose dir is gone.

        Pods only reconstruction knows (found on the node, the log lost) get
        one too: it is what makes the folds forget their entries.
        """
        removed = await asyncio.to_thread(self._remove_pod_dirs, uids)
        done = [uid for uid in removed if uid not in self.dsw.pods]
        if not done:
            return
        names: dict[str, list[str]] = {uid: [] for uid in done}
        for uid, name in self.asw.podvols:  # one pass for the batch
            entry = names.get(uid)
            if entry is not None:
                entry.append(name)
        for uid in done:
            body = PodCleanedUp(pod_uid=uid, volume_names=tuple(sorted(names[uid])))
            try:
                await self.recorder.record_async(pod_stream(uid), [body])
            except (VolfsmError, VolfsmEventsError) as exc:  # closing: the next start redoes it
                log.warning("pod {} cleaned up, but that could not be recorded: {}", uid, exc)
                return

    def _remove_pod_dirs(self, uids: list[str]) -> list[str]:
        """Remove each pod's dir, directories only; the uids whose dir is gone."""
        removed = []
        for uid in uids:
            try:
                result = remove_pod_dir(self.layout, uid)
            except (VolfsmError, OSError) as exc:
                why = str(exc)
            else:
                why = result.summary(KEPT_OWNER) if not result.gone else ""
            if why:
                self.failures[uid] = why
                log.warning("orphaned pod {}: its dir stays: {}", uid, why)
            else:
                self.failures.pop(uid, None)
                removed.append(uid)
        return removed
