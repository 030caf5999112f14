"""The reconciler: compares desired and actual state and starts operations, kubelet's way.

Each pass runs kubelet's phases in its order, for each volume that needs a
look (reference §2.2-§2.3; the order matters only within a volume, since
operation keys are per volume):

1. unmount pod-volumes (Mounted or Uncertain) no pod wants any more;
2. mount / remount / map what is desired and not Mounted (the mount waits
   for attach itself; a ReadWriteOncePod volume another pod uses is not
   mounted, see `volfsm.engine.rwop`), and expand online what pods want bigger;
3. unstage / unmap devices no pod holds, no pod wants, and nothing is
   running on; mark the rest detached;
4. once: orphan cleanup (`Reconstructor.start_orphan_cleanup`); and
   removal of the directories of deleted pods whose volumes are all gone
   (`volfsm.engine.poddirs`: directories only; a file volfsm did not create
   keeps the pod dir, reported in `pod_dir_failures`).

Phases 1, 3 and 4 wait for `desired_complete` (kubelet's readyToUnmount):
until the desired state is known complete - the engine is told, or
`EngineConfig.desired_grace` seconds pass after the loop starts - nothing
is unmounted, unstaged, detached or removed; mounts run from the start.
When the log cannot vouch for the node (`until_told`: the log was lost,
the root dir adopted, or reconstruction found volumes the log does not
know) the grace timer does not apply: only being told opens the gate.

Entries reconstruction found on the node have no spec in the log; their
specs (rebuilt from the node) are in `reconstructed` and
`reconstructed_devices`. A reconstructed CSI pod-volume is named by its
directory (the PV name); when a desired pod calls the same volume by
another name, phase 2 hands the entry over (`OperationGenerator.adopt`)
and phase 1 leaves the old name alone, so the mount the pod uses is never
unmounted as "not desired".

Unlike the kubelet, which walks every volume every 100 ms, a pass looks
only at "dirty" volumes: ones whose desired state changed or whose
operation finished (both also wake the loop at once), plus the ones whose
operation was refused (running elsewhere or backing off), which are looked
at again every `reconcile_period` - level-triggered over what is left to
do. Every `full_resync_period` a full pass screens every volume (a byte
of facts each, `screen`) and marks the ones with something to do. An
idle node therefore costs nothing per period, whatever its size, and a
change is acted on without waiting for the period.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from loguru import logger as log

from events.tables import ATTACHED, GLOBALLY_MOUNTED, MOUNTED, UNCERTAIN, UNMOUNTED
from events.types import DesiredVolume, PodAdded
from projections.asw import Asw
from volfsm.engine.columns import ScreenColumns
from volfsm.engine.config import EngineConfig
from volfsm.engine.executor import Operation, OperationExecutor
from volfsm.engine.index import EngineIndex
from volfsm.engine.operations import EXPAND_VOLUME, OperationGenerator
from volfsm.engine.pending import NestedPendingOperations
from volfsm.engine.poddirs import PodDirCleaner
from volfsm.engine.rwop import RwopGuard
from volfsm.gate import GATE_OPEN, GATE_UNTIL_TOLD, GATE_UNTIL_TOLD_OR_GRACE
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import PluginError


class DesiredState(Protocol):
    """What the reconciler reads from the DSW."""

    pods: dict[str, PodAdded]

    def is_desired(self, pod_uid: str, volume_name: str) -> bool:
        """Whether the pod wants its volume `volume_name`."""

    def volume_desired(self, volume_id: str) -> bool:
        """Whether any pod wants the volume."""

    def desired_size(self, volume_id: str) -> int | None:
        """The size pods want, or None."""

    def pods_on_volume(self, volume_id: str) -> list[str]:
        """UIDs of the pods that want the volume."""

    def volumes_to_mount(self) -> list[tuple[PodAdded, DesiredVolume]]:
        """Every desired (pod, volume)."""

    def desired_entries(self) -> Mapping[tuple[str, str], tuple[PodAdded, DesiredVolume]]:
        """(pod uid, volume name) -> (pod, volume) of every desired pod-volume."""

    def desired_sizes(self) -> Mapping[str, int]:
        """volume id -> the size pods want, for the volumes that have one."""


@dataclass
class PassStats:
    """What one pass looked at and started."""

    volumes: int = 0
    started: int = 0
    refused: int = 0


REASON_NOT_DESIRED = "no pod wants this pod-volume any more"
REASON_MOUNT = "desired and not mounted"
REASON_REMOUNT_UNCERTAIN = "desired and Uncertain: remount"
REASON_REMOUNT = "remount requested"
REASON_UNSTAGE = "no pod holds or wants the volume"

VERIFY_EVERY = 30
"""Every this many screens (5 min at the 10 s full resync) the columns are checked entry by
entry against the state."""
VERIFY_CHUNK = 2000
"""Entries checked between two turns of the event loop (a few ms)."""


class Reconciler:
    """Runs the reconcile passes and owns the dirty set."""

    def __init__(
        self,
        *,
        asw: Asw,
        dsw: DesiredState,
        index: EngineIndex,
        pending: NestedPendingOperations,
        executor: OperationExecutor,
        generator: OperationGenerator,
        layout: RootLayout,
        config: EngineConfig,
    ) -> None:
        self.asw = asw
        self.dsw = dsw
        self.index = index
        self.pending = pending
        self.executor = executor
        self.ops = generator
        self.layout = layout
        self.config = config
        self.desired_complete = config.desired_complete
        self.complete_reason = "complete at start" if config.desired_complete else ""
        """How the desired state became complete ("" while it is not)."""
        self.grace_deadline: float | None = None
        """Loop time when the grace period ends (set when the loop starts, if it applies)."""
        self._grace: asyncio.TimerHandle | None = None
        self.until_told = "" if config.desired_complete else config.log_lost
        """Why only `set_desired_complete` may open the gate ("" while the grace timer may)."""
        self.on_hold: Callable[[str], None] | None = None
        """Called with the reasons when `hold_until_told` adds one (the service records it)."""
        self.on_complete: Callable[[str], None] | None = None
        """Called with the reason once the desired state is complete."""
        self.reconstructed: dict[tuple[str, str], DesiredVolume] = {}
        """Specs of pod-volumes reconstruction rebuilt from the node (the log has none)."""
        self.reconstructed_devices: dict[str, DesiredVolume] = {}
        """Specs of devices reconstruction rebuilt from the node."""
        self.remount_required: dict[tuple[str, str], int] = {}
        """Pod-volumes to SetUp again -> the number of the latest request (`request_remount`)."""
        self.remount_started: dict[tuple[str, str], int] = {}
        """Pod-volumes whose mount started while a remount was asked for -> the request it
        answers: its VolumeMounted clears that request only, not one made after the start
        (an object changed again while a SetUp was writing the old content)."""
        self._remount_requests = 0
        self.expand_failed: dict[str, int] = generator.expand_failed
        """volume_id -> the size whose node expansion failed with a final error (shared with
        the generator, whose expansion during mount records such failures too)."""
        self.columns = ScreenColumns(asw, dsw, index)
        """The screen's facts, a byte per pod-volume and device (the engine keeps them)."""
        self._screens = 0
        self._verifying: asyncio.Task[list[str]] | None = None
        self.rwop = RwopGuard(dsw, index)
        """Holds back mounts of a ReadWriteOncePod volume another pod uses."""
        self.orphan_cleanup: Callable[[], None] | None = None
        """One-shot hook run on the first pass after the desired state is complete."""
        self._orphans_done = False
        self._dirty: dict[str, None] = {}
        self._retry: dict[str, None] = {}
        self.pod_dirs = PodDirCleaner(
            asw=asw, dsw=dsw, index=index, pending=pending, layout=layout,
            recorder=generator.handler, reconstructed=self.reconstructed,
        )  # fmt: skip
        self._wake = asyncio.Event()
        self._stopping = False
        self.passes = 0
        self.last_stats = PassStats()

    # ------------------------------------------------------------ dirtiness

    def mark_dirty(self, volume_id: str) -> None:
        """Look at `volume_id` on the next pass."""
        self._dirty[volume_id] = None

    def mark_many_dirty(self, volume_ids: Iterable[str]) -> None:
        """Look at each of `volume_ids` on the next pass."""
        self._dirty.update(dict.fromkeys(volume_ids))

    def mark_all_dirty(self) -> None:
        """Look, on the next pass, at every volume a full pass would act on (see `screen`).

        Every `VERIFY_EVERY`-th time the screen's facts are also checked
        against the state entry by entry (`verify_columns`), in parts between
        which the event loop runs: the events keep them in step, and this
        keeps the full pass a check that does not rest on that alone.
        """
        self._screens += 1
        if self._screens % VERIFY_EVERY == 0 and self._verifying is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (tools): all at once
                self._report_stale(self.columns.repair())
            else:
                self._verifying = loop.create_task(self.verify_columns())
        self.mark_many_dirty(self.screen())

    async def verify_columns(self) -> list[str]:
        """Check every byte of the screen's columns against the state, `VERIFY_CHUNK` entries
        at a time; set those out of step and look at their volumes. What was out of step."""
        try:
            keys, vids = self.columns.all_keys()
            stale: list[str] = []
            for i in range(0, len(keys), VERIFY_CHUNK):
                stale += self.columns.repair_some(keys[i : i + VERIFY_CHUNK], ())
                await asyncio.sleep(0)
            for i in range(0, len(vids), VERIFY_CHUNK):
                stale += self.columns.repair_some((), vids[i : i + VERIFY_CHUNK])
                await asyncio.sleep(0)
            self._report_stale(stale)
            return stale
        finally:
            self._verifying = None

    def _report_stale(self, stale: list[str]) -> None:
        if not stale:
            return
        log.warning(
            "the full screen's facts were out of step with the state for {} entries "
            "(set again from the state): {}",
            len(stale),
            ", ".join(stale[:5]),
        )
        self.mark_many_dirty(self.screen())
        self.wake()

    def screen(self) -> set[str]:
        """Every volume on which some phase has something to do: the full pass, cheaply.

        Conservative: a volume that a pass would act on is always included
        (one that would only be refused again may be too). The checks of
        every pod-volume and device are sweeps over `columns`, a byte of
        facts per entry, so a screen reads about 1 byte per entry rather than
        a dozen objects; entries are looked up only where a sweep found
        something. Volumes no pod wants any more and remounts asked for are
        few, and checked one by one.
        """
        # Phases 1-3 and online expansion: the columns (`volfsm.engine.columns`).
        need = self.columns.screen()
        devices = self.asw.devices
        need.update(vid for vid in self.index.removed_volumes if vid not in devices)
        for uid, name in self.remount_required:
            spec = self.spec_of(uid, name)
            if spec is not None:
                need.add(spec.volume_id)
        return need

    def request_remount(self, key: tuple[str, str]) -> None:
        """Ask for SetUp again on a pod-volume (a later request supersedes an earlier one)."""
        self._remount_requests += 1
        self.remount_required[key] = self._remount_requests

    def remounted(self, key: tuple[str, str]) -> None:
        """A VolumeMounted of `key`: the request its mount started under is answered."""
        answered = self.remount_started.pop(key, None)
        if answered is not None and self.remount_required.get(key) == answered:
            del self.remount_required[key]

    def forget_remounts(self, uid: str) -> None:
        """A pod went: its volumes are unmounted, not set up again."""
        for pending in (self.remount_required, self.remount_started):
            for key in [key for key in pending if key[0] == uid]:
                del pending[key]

    def wake(self) -> None:
        """Run a pass now rather than at the end of the period."""
        self._wake.set()

    def queue_pod_cleanup(self, uid: str) -> None:
        """The pod is gone from the desired state and holds nothing: remove its dir."""
        self.pod_dirs.queue(uid)

    def set_desired_complete(self, reason: str = "told") -> None:
        """The desired state is complete: unmounts may start (readyToUnmount)."""
        if not self.desired_complete:
            self.desired_complete = True
            self.complete_reason = reason
            if self._grace is not None:
                self._grace.cancel()
            log.info("desired state complete ({}): unmounts may start", reason)
            self.mark_all_dirty()
            self.wake()
            if self.on_complete is not None:
                self.on_complete(reason)

    def hold_until_told(self, reason: str) -> None:
        """From now on only `set_desired_complete` opens the gate: the grace timer is off."""
        if self.desired_complete or reason in self.until_told:
            return
        self.until_told = f"{self.until_told}; {reason}" if self.until_told else reason
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        self.grace_deadline = None
        log.warning(
            "desired state not complete: {}: nothing is unmounted until `volfsm apply -f DIR"
            " --complete`; the grace timer does not apply",
            self.until_told,
        )
        if self.on_hold is not None:
            self.on_hold(self.until_told)

    @property
    def gate(self) -> str:
        """How the gate may open: `volfsm.gate`'s GATE_* values."""
        if self.desired_complete:
            return GATE_OPEN
        if self.until_told or self.config.desired_grace is None:
            return GATE_UNTIL_TOLD
        return GATE_UNTIL_TOLD_OR_GRACE

    def start_grace(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the grace period (if one applies and it did not start yet)."""
        grace = self.config.desired_grace
        if self.desired_complete or grace is None or self._grace is not None or self.until_told:
            return
        self.grace_deadline = loop.time() + grace
        self._grace = loop.call_later(grace, self._grace_over, grace)

    def _grace_over(self, grace: float) -> None:
        if not self.desired_complete:
            log.warning(
                "nobody said the desired state is complete within {:g}s of start: taking it"
                " as complete; volumes no pod wants may now be unmounted",
                grace,
            )
            self.set_desired_complete(f"grace period of {grace:g}s after start passed")

    def grace_left(self) -> float | None:
        """Seconds until the grace period ends (None if none runs)."""
        if self.desired_complete or self.grace_deadline is None:
            return None
        return max(0.0, self.grace_deadline - asyncio.get_running_loop().time())

    # ------------------------------------------------------ reconstructed specs

    def spec_of(self, uid: str, name: str) -> DesiredVolume | None:
        """A pod-volume's spec: from the log (index), else as reconstruction rebuilt it."""
        spec = self.index.spec_of(uid, name)
        if spec is None and self.reconstructed:
            return self.reconstructed.get((uid, name))
        return spec

    def volume_spec(self, volume_id: str) -> DesiredVolume | None:
        """A volume's spec: from the log (index), else as reconstruction rebuilt it."""
        spec = self.index.volume_spec(volume_id)
        if spec is None and self.reconstructed_devices:
            return self.reconstructed_devices.get(volume_id)
        return spec

    def _alias_of(self, uid: str, dv: DesiredVolume) -> str | None:
        """The name of a reconstructed entry that is `dv` of pod `uid` under another name."""
        for held_uid, name in self.index.holders.get(dv.volume_id, ()):
            if (
                held_uid == uid
                and name != dv.name
                and (uid, name) in self.reconstructed
                and not self.dsw.is_desired(uid, name)
            ):
                return name
        return None

    def _wanted_elsewhere(self, uid: str, name: str, vid: str) -> bool:
        """Whether a reconstructed (uid, name) is the desired pod's volume `vid` by another name."""
        if (uid, name) not in self.reconstructed:
            return False
        pod = self.dsw.pods.get(uid)
        return pod is not None and any(
            dv.volume_id == vid and dv.name != name for dv in pod.volumes
        )

    @property
    def dirty(self) -> int:
        """Volumes waiting for a look (not counting retries)."""
        return len(self._dirty)

    # ------------------------------------------------------------------ pass

    def _take(self, limit: int | None) -> list[str]:
        if limit is None or len(self._dirty) <= limit:
            batch = list(self._dirty)
            self._dirty = {}
            return batch
        batch = list(itertools.islice(self._dirty, limit))
        for vid in batch:
            del self._dirty[vid]
        return batch

    def reconcile(self, limit: int | None = None) -> PassStats:
        """One pass over (up to `limit` of) the dirty volumes, phases in kubelet's order."""
        batch = self._take(limit)
        stats = PassStats(volumes=len(batch))
        started, refused = self.executor.started, self.executor.refused
        ready = self.desired_complete
        holders = self.index.holders.get
        pods_on = self.dsw.pods_on_volume
        for vid in batch:
            # Kubelet's phases, in its order for each volume. Keys are per volume,
            # so this gives the same guarantees as running each phase over the whole
            # batch: the old pod's unmount starts before the new pod's mount, and a
            # device is looked at only when no pod holds or wants it.
            held = holders(vid)
            if held and ready:
                self._unmount_volumes(vid, held)
            uids = pods_on(vid)
            if uids:
                self._mount_attach(vid, uids)
            else:
                if self.rwop.waiting:
                    self.rwop.note_waiting(vid, {})
                if ready and not held:
                    self._unmount_detach_device(vid)
        if ready and not self._orphans_done:
            self._orphans_done = True
            if self.orphan_cleanup is not None:
                self.orphan_cleanup()
        stats.started = self.executor.started - started
        stats.refused = self.executor.refused - refused
        self.passes += 1
        self.last_stats = stats
        return stats

    def full_pass(self) -> PassStats:
        """Screen every volume and run one unbounded pass over what needs a look."""
        self.mark_all_dirty()
        return self.reconcile()

    def _start(self, op: Operation, volume_id: str) -> bool:
        if self.executor.start(op):
            return True
        self._retry[volume_id] = None
        return False

    # ----------------------------------------------------------- phase 1

    def _unmount_volumes(self, vid: str, held: list[tuple[str, str]]) -> None:
        is_desired = self.dsw.is_desired
        for uid, name in list(held):
            if is_desired(uid, name):
                continue
            if self.reconstructed and self._wanted_elsewhere(uid, name, vid):
                continue  # phase 2 hands it over to the name the pod uses
            dv = self.spec_of(uid, name)
            if dv is None:
                log.warning("cannot unmount {} of pod {}: its spec is unknown", name, uid)
                continue
            self._start(self.ops.unmount(uid, dv, REASON_NOT_DESIRED), vid)

    # ----------------------------------------------------------- phase 2

    def _mount_attach(self, vid: str, uids: list[str]) -> None:
        pods = self.dsw.pods
        podvols = self.asw.podvols
        remounts = self.remount_required
        waiting: dict[str, str] = {}
        for uid in uids:
            pod = pods.get(uid)
            dv = _volume_of(pod, vid) if pod is not None else None
            if dv is None:
                continue
            pv = podvols.get((uid, dv.name))
            if self.reconstructed and (pv is None or pv.state == UNMOUNTED):
                found = self._alias_of(uid, dv)
                if found is not None:
                    self._start(self.ops.adopt(uid, found, dv), vid)
                    continue
            if pv is None or pv.state == UNMOUNTED:
                why = self.rwop.wait_reason(uid, dv)
                if why:
                    waiting[uid] = why  # the volume is marked dirty when its user goes
                    continue
            if pv is None or pv.state != MOUNTED:
                reason = REASON_REMOUNT_UNCERTAIN if pv and pv.state == UNCERTAIN else REASON_MOUNT
            elif remounts and (uid, dv.name) in remounts:
                reason = REASON_REMOUNT
            else:
                self._maybe_expand(uid, dv)
                continue
            if self._start(self.ops.mount(uid, dv, reason), vid):
                self.rwop.started(uid, dv)
                request = remounts.get((uid, dv.name)) if remounts else None
                if request is not None:
                    self.remount_started[(uid, dv.name)] = request
        if waiting or vid in self.rwop.waiting:
            self.rwop.note_waiting(vid, waiting)

    def _maybe_expand(self, uid: str, dv: DesiredVolume) -> None:
        if dv.read_only:
            return  # kubelet's populator skips read-only volumes (checkVolumeFSResize)
        vid = dv.volume_id
        want = self.dsw.desired_size(vid)
        if want is None:
            return
        dev = self.asw.devices.get(vid)
        if dev is None or dev.size_bytes is None or want <= dev.size_bytes:
            return
        if self.expand_failed.get(vid) == want:
            return
        plugin = self.ops.find_plugin(dv.source)
        if isinstance(plugin, PluginError) or not plugin.supports_expansion(dv.source):
            return
        reason = f"pods want {want} bytes, the volume has {dev.size_bytes}"
        self._start(self.ops.expand(uid, dv, plugin, want, reason), vid)

    def on_operation_finished(self, op: Operation) -> None:
        """Forget a finished ReadWriteOncePod mount; remember final online-expansion
        failures (kubelet: no retry until the size changes)."""
        self.rwop.finished(op)
        if op.name != EXPAND_VOLUME:
            return
        if op.failure is not None and op.failure.final:
            want = self.dsw.desired_size(op.volume_id)
            if want is not None:
                self.expand_failed[op.volume_id] = want
        elif op.failure is None:
            self.expand_failed.pop(op.volume_id, None)

    # ----------------------------------------------------------- phase 3

    def _unmount_detach_device(self, vid: str) -> None:
        """No pod holds or wants the volume: unstage / unmap it, or mark it detached."""
        if self.pending.is_operation_pending(vid):
            return  # its completion marks the volume dirty again
        dev = self.asw.devices.get(vid)
        if dev is None:
            self.index.forget_volume(vid)
            return
        state = dev.state
        if state in (GLOBALLY_MOUNTED, UNCERTAIN):
            dv = self.volume_spec(vid)
            if dv is None:
                log.warning("cannot unstage {}: its spec is unknown", vid)
                return
            self._start(self.ops.unmount_device(dv, REASON_UNSTAGE), vid)
        elif state == ATTACHED:
            self._start(self.ops.mark_detached(vid), vid)

    # ------------------------------------------------------------ pod dirs

    @property
    def pod_dir_failures(self) -> dict[str, str]:
        """uid -> why the pod's dir could not be removed (until it is)."""
        return self.pod_dirs.failures

    def pod_holds_any(self, uid: str) -> bool:
        """Whether any of the pod's volumes (reconstructed ones too) is Mounted or Uncertain."""
        return self.pod_dirs.pod_holds_any(uid)

    def _clean_pod_dirs(self) -> None:
        """Start removing dirs of deleted pods whose volumes are all gone (gate open only)."""
        if self.desired_complete:
            self.pod_dirs.clean()

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        """Reconcile until cancelled: on every wake-up, and every period for retries."""
        loop = asyncio.get_running_loop()
        period = self.config.reconcile_period
        full_period = self.config.full_resync_period
        next_retry = loop.time() + period
        next_full = loop.time() + full_period
        limit = self.config.max_volumes_per_pass
        self.start_grace(loop)
        while not self._stopping:
            now = loop.time()
            if now >= next_full:
                self.mark_all_dirty()
                next_full = now + full_period
            if now >= next_retry:
                if self._retry:
                    self._dirty.update(self._retry)
                    self._retry = {}
                next_retry = now + period
            self._wake.clear()
            self.reconcile(limit)
            self._clean_pod_dirs()
            if self._dirty:
                await asyncio.sleep(0)
                continue
            timeout = min(next_retry, next_full) - loop.time()
            if timeout <= 0:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    def stop(self) -> None:
        """End `run` after its current pass (cancelling its task alone can be lost in 3.11)."""
        self._stopping = True
        if self._grace is not None:
            self._grace.cancel()
        if self._verifying is not None:
            self._verifying.cancel()
        self._wake.set()

    async def wait_cleanup(self) -> None:
        """Wait for a running pod-dir cleanup (tests)."""
        await self.pod_dirs.wait()


def _volume_of(pod: PodAdded, volume_id: str) -> DesiredVolume | None:
    for dv in pod.volumes:
        if dv.volume_id == volume_id:
            return dv
    return None
