"""Volume stats and health: the kubelet's volume stats calculators, off the scrape path.

Kubelet (`pkg/kubelet/server/stats/volume_stat_calculator.go`, reference
plugins §12) runs one calculator per pod: at once, then every
`--volume-stats-agg-period` * (1 + rand[0,1)), sliding; scrapes read the
cache. `VolumeStatsGatherer` does the same in one asyncio task: each pod
with a Mounted volume backed by a PersistentVolumeClaim is due at once
(woken by its VolumeMounted), then again after period * (1 + jitter).

Per volume:

* a plugin with NodeGetVolumeStats (`StatsSource`: CSI with
  GET_VOLUME_STATS) answers usage and, with VOLUME_CONDITION, the volume
  condition;
* otherwise statvfs(2) of the pod's mount path, as kubelet's MetricsStatFS
  (a CSI driver without GET_VOLUME_STATS gets statvfs too when its publish
  path is a mount point; kubelet reports nothing for it).

Results are kept per pod-volume (`stats`) for `/metrics` and `volfsm get`.
What the log gets is changes only, on the pod-volume stream: a
`VolumeConditionChanged` when the condition differs from what the log last
said (a first normal report is no change), and a `VolumeUsageChanged` the
first time after a mount and whenever the capacity or the used share's
5 % step changes, so that replay and analytics see health and how full
volumes get without an event per period.

An emptyDir on the node's disk with a `sizeLimit` is measured too, as the
kubelet's eviction manager sees it (`emptyDirLimitEviction`, fed by the
emptyDir's MetricsDu): the bytes its tree uses on disk (`volfsm.node.
diskusage`, a bounded walk in a thread, never on the event loop), against
the limit. The kubelet evicts the pod whose emptyDir uses more than its
limit ("Usage of EmptyDir volume %q exceeds the limit %q."); volfsm has no
pod lifecycle to end, so it reports instead: a `VolumeConditionChanged`
with the kubelet's message when the usage goes over the limit and another
when it is back under, the condition in `volfsm get`, and the
`volfsm_emptydir_*` gauges. Nothing is deleted. No usage event is recorded
for it (the kubelet exports no emptyDir usage either).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from loguru import logger as log

from events.streams import podvol_stream
from events.tables import MOUNTED
from events.types import (
    Body,
    DesiredVolume,
    Envelope,
    PodAdded,
    VolumeConditionChanged,
    VolumeMounted,
    VolumeSource,
    VolumeUnmounted,
    VolumeUsageChanged,
)
from projections.asw import Asw, PodVolumeState
from volfsm.desired.quantity import format_bytes
from volfsm.node.diskusage import DirUsage, disk_usage
from volfsm.node.layout import EMPTY_DIR_PLUGIN
from volfsm.plugins.base import BLOCK, PluginError, VolumePlugin, VolumeRequest

USAGE_STEPS = 20
"""The used share is recorded in steps of 1/USAGE_STEPS (5 %)."""
STATVFS_TIMEOUT_S = 10.0
"""A statvfs that takes longer (a hung network filesystem) is given up for this period."""
MIN_PASS_GAP_S = 0.2
"""Passes over the pods are at least this far apart (each looks at every pod-volume)."""
SOURCE_CSI = "csi"
SOURCE_STATVFS = "statvfs"
SOURCE_DU = "du"
DU_TIME_LIMIT_S = 10.0
"""A walk of an emptyDir stops after this long (its count so far is a lower bound)."""
DU_MAX_ENTRIES = 1_000_000
"""... or after this many entries."""

PodVolumeKey = tuple[str, str]


class StatsReply(Protocol):
    """What NodeGetVolumeStats said (`volfsm.plugins.csi.client.VolumeStatsReply`)."""

    @property
    def usage(self) -> dict[str, int]:
        """bytes_total, bytes_used, bytes_available, inodes_total, ... (missing: not said)."""

    @property
    def abnormal(self) -> bool | None:
        """The volume condition (None: none reported)."""

    @property
    def message(self) -> str:
        """The condition's message."""


@runtime_checkable
class StatsSource(Protocol):
    """A plugin that answers NodeGetVolumeStats (the CSI plugin)."""

    async def volume_stats_reply(self, req: VolumeRequest) -> StatsReply:
        """Usage and condition of the volume published for the pod of `req`."""


class SpecIndex(Protocol):
    """Where the gatherer finds a pod's spec and its volumes' specs."""

    def pod_spec(self, uid: str) -> PodAdded | None:
        """The pod as last added (None if unknown)."""


class PluginFinder(Protocol):
    """The plugin catalog."""

    def find(self, source: VolumeSource) -> VolumePlugin:
        """The plugin serving `source` (PluginError if none)."""


class Recorder(Protocol):
    """The command handler: appends non-transition events."""

    async def record_async(self, stream: str, bodies: list[Body]) -> list[Envelope]:
        """Append `bodies` to `stream`."""


@dataclass(frozen=True, slots=True)
class VolumeUsage:
    """One volume's numbers, named as the kubelet's `kubelet_volume_stats_*` gauges."""

    capacity_bytes: int = 0
    available_bytes: int = 0
    used_bytes: int = 0
    inodes: int = 0
    inodes_free: int = 0
    inodes_used: int = 0
    source: str = ""

    def step(self) -> int:
        """The used share in steps of 1/USAGE_STEPS (-1 without a capacity)."""
        if self.capacity_bytes <= 0:
            return -1
        return min(USAGE_STEPS, self.used_bytes * USAGE_STEPS // self.capacity_bytes)


@dataclass(frozen=True, slots=True)
class VolumeStats:
    """What the last gathering found for one pod-volume."""

    pod_uid: str
    volume_name: str
    volume_id: str
    namespace: str
    pod_name: str
    claim: str
    metric_source: str
    """kubelet_volume_metric_collection_duration_seconds' label: the CSI driver, or the plugin."""
    usage: VolumeUsage | None
    abnormal: bool | None
    """None: no condition reported (the driver has no VOLUME_CONDITION, or statvfs)."""
    message: str
    gathered_us: int
    size_limit_bytes: int | None = None
    """A disk-backed emptyDir's sizeLimit (None for every other volume)."""


def limited_empty_dir(spec: DesiredVolume) -> int | None:
    """The sizeLimit of a disk-backed emptyDir that has one (> 0), else None."""
    source = spec.source
    if source.plugin != EMPTY_DIR_PLUGIN or source.medium:
        return None
    limit = source.size_limit_bytes
    return limit if limit is not None and limit > 0 else None


def quantity_text(size: int) -> str:
    """A byte count as Kubernetes prints a quantity: binary suffix if one divides it,
    else a decimal one ("1Mi", "1536Mi", "1M", "1500k", "1000001")."""
    if size % 1024 == 0:
        return format_bytes(size)
    for suffix, power in (("E", 18), ("P", 15), ("T", 12), ("G", 9), ("M", 6), ("k", 3)):
        unit = 10**power
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def size_limit_message(volume_name: str, limit: int) -> str:
    """The kubelet's eviction message (emptyDirMessageFmt), without its trailing blank."""
    return f'Usage of EmptyDir volume "{volume_name}" exceeds the limit "{quantity_text(limit)}".'


def usage_of_statvfs(st: os.statvfs_result) -> VolumeUsage:
    """statvfs numbers as kubelet's fs.Info computes them (pkg/volume/util/fs)."""
    frsize = st.f_frsize or st.f_bsize
    return VolumeUsage(
        capacity_bytes=st.f_blocks * frsize,
        available_bytes=st.f_bavail * frsize,
        used_bytes=(st.f_blocks - st.f_bfree) * frsize,
        inodes=st.f_files,
        inodes_free=st.f_ffree,
        inodes_used=st.f_files - st.f_ffree,
        source=SOURCE_STATVFS,
    )


def usage_of_csi(numbers: dict[str, int]) -> VolumeUsage:
    """NodeGetVolumeStats numbers (`CsiClient.volume_stats`); missing ones are 0."""
    return VolumeUsage(
        capacity_bytes=numbers.get("bytes_total", 0),
        available_bytes=numbers.get("bytes_available", 0),
        used_bytes=numbers.get("bytes_used", 0),
        inodes=numbers.get("inodes_total", 0),
        inodes_free=numbers.get("inodes_available", 0),
        inodes_used=numbers.get("inodes_used", 0),
        source=SOURCE_CSI,
    )


@dataclass(frozen=True, slots=True)
class _Target:
    """One Mounted, PVC-backed pod-volume to gather."""

    pod: PodAdded
    spec: DesiredVolume
    entry: PodVolumeState


DurationObserver = Callable[[str, float], None]
"""Told (metric_source, seconds) after each volume's gathering."""


class VolumeStatsGatherer:
    """The per-pod stats calculators of one node, as one task (see the module doc)."""

    def __init__(
        self,
        *,
        asw: Asw,
        index: SpecIndex,
        plugins: PluginFinder,
        recorder: Recorder,
        root: Path,
        period: float,
        jitter: bool = True,
    ) -> None:
        self.asw = asw
        self.index = index
        self.plugins = plugins
        self.recorder = recorder
        self.root = root
        self.period = period
        self.jitter = jitter
        self.stats: dict[PodVolumeKey, VolumeStats] = {}
        self._holders: dict[str, dict[PodVolumeKey, None]] = {}
        """volume id -> the pod-volumes with stats of it, first measured first."""
        """The last gathering of each Mounted PVC-backed pod-volume (first pod first)."""
        self.on_duration: DurationObserver | None = None
        self.gatherings = 0
        """Passes over a pod done so far (tests wait on it)."""
        self._due: dict[str, float] = {}
        self._walking: set[PodVolumeKey] = set()
        """emptyDirs whose disk usage walk is running (a second one waits for the next pass)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        """False when the period is 0 or less (kubelet: "Volume stats collection disabled")."""
        return self.period > 0

    # ----------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start gathering (nothing when disabled)."""
        if not self.enabled or self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(self.run(), name="volfsm-volstats")

    async def stop(self) -> None:
        """Stop gathering; a gathering under way is cancelled."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def observe(self, envs: list[Envelope]) -> None:
        """A `CommandHandler` listener: a mount makes its pod due now; an unmount drops it."""
        for env in envs:
            body = env.body
            if isinstance(body, VolumeMounted):
                self._due.pop(body.pod_uid, None)
                self._wake.set()
            elif isinstance(body, VolumeUnmounted):
                self._drop((body.pod_uid, body.volume_name))

    # ---------------------------------------------------------------- loop

    async def run(self) -> None:
        """Gather each pod when it is due, forever (until cancelled)."""
        while True:
            self._wake.clear()
            try:
                await self.gather_due()
            except Exception:  # never let one bad pass end the gatherer
                log.exception("volume stats gathering failed")
            await asyncio.sleep(min(MIN_PASS_GAP_S, self.period))  # a mount storm: few passes
            await self._sleep()

    async def _sleep(self) -> None:
        now = time.monotonic()
        wait = min((due - now for due in self._due.values()), default=self.period)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), max(0.0, min(wait, self.period)))

    async def gather_due(self) -> None:
        """One pass: gather every pod that is due, forget what is no longer mounted."""
        targets = self._targets()
        self._forget(targets)
        now = time.monotonic()
        for uid, volumes in targets.items():
            if self._due.setdefault(uid, now) > now:
                continue
            for target in volumes:
                await self._gather(target)
            self.gatherings += 1
            factor = 1.0 + (random.random() if self.jitter else 0.0)
            self._due[uid] = time.monotonic() + self.period * factor

    def _targets(self) -> dict[str, list[_Target]]:
        """Mounted pod-volumes with a PVC or a limited disk-backed emptyDir, by pod uid."""
        out: dict[str, list[_Target]] = {}
        for (uid, name), entry in list(self.asw.podvols.items()):
            if entry.state != MOUNTED:
                continue
            pod = self.index.pod_spec(uid)
            spec = next((v for v in pod.volumes if v.name == name), None) if pod else None
            if pod is None or spec is None:
                continue
            if not spec.claim_name and limited_empty_dir(spec) is None:
                continue
            out.setdefault(uid, []).append(_Target(pod, spec, entry))
        return out

    def _forget(self, targets: dict[str, list[_Target]]) -> None:
        keep = {(t.pod.pod_uid, t.spec.name) for ts in targets.values() for t in ts}
        for key in [k for k in self.stats if k not in keep]:
            self._drop(key)
        for uid in [u for u in self._due if u not in targets]:
            del self._due[uid]

    # ------------------------------------------------------------ one volume

    async def _gather(self, target: _Target) -> None:
        spec = target.spec
        try:
            plugin = self.plugins.find(spec.source)
        except PluginError:
            return
        source = spec.source.driver or plugin.name
        started = time.perf_counter()
        reply = await self._measure(plugin, target)
        if self.on_duration is not None:
            self.on_duration(source, time.perf_counter() - started)
        if reply is None:
            return
        usage, abnormal, message = reply
        key = (target.pod.pod_uid, spec.name)
        if key in self.stats or self._still_mounted(key):
            self._holders.setdefault(spec.volume_id, {})[key] = None
            self.stats[key] = VolumeStats(
                pod_uid=target.pod.pod_uid,
                volume_name=spec.name,
                volume_id=spec.volume_id,
                namespace=target.pod.namespace,
                pod_name=target.pod.name,
                claim=spec.claim_name,
                metric_source=source,
                usage=usage,
                abnormal=abnormal,
                message=message,
                gathered_us=time.time_ns() // 1000,
                size_limit_bytes=limited_empty_dir(spec),
            )
            await self._record_changes(target, usage, abnormal, message)

    def _still_mounted(self, key: PodVolumeKey) -> bool:
        entry = self.asw.podvols.get(key)
        return entry is not None and entry.state == MOUNTED

    async def _measure(
        self, plugin: VolumePlugin, target: _Target
    ) -> tuple[VolumeUsage | None, bool | None, str] | None:
        """(usage, abnormal, message) of one volume; None if nothing could be measured."""
        spec = target.spec
        mount_path = target.entry.mount_path
        limit = limited_empty_dir(spec)
        if limit is not None:
            return await self._measure_empty_dir(target, limit)
        if isinstance(plugin, StatsSource):
            try:
                reply = await plugin.volume_stats_reply(self._request(target))
            except PluginError as exc:
                if exc.code != "Unimplemented":
                    log.debug("NodeGetVolumeStats of {} failed: {}", spec.volume_id, exc)
                    return None
            else:
                usage = usage_of_csi(reply.usage) if reply.usage else None
                return usage, reply.abnormal, reply.message
            if spec.volume_mode == BLOCK or not mount_path or not os.path.ismount(mount_path):
                return None
        if spec.volume_mode == BLOCK or not mount_path:
            return None
        usage = await self._statvfs(mount_path)
        return (usage, None, "") if usage is not None else None

    async def _measure_empty_dir(
        self, target: _Target, limit: int
    ) -> tuple[VolumeUsage | None, bool | None, str] | None:
        """A disk-backed emptyDir against its sizeLimit: du of its tree, statvfs for the rest.

        Over the limit (more bytes, as the kubelet compares) is abnormal, with
        the kubelet's message; under it normal. A walk that stopped early
        counts only when what it saw is already over the limit (else the
        condition is unknown and its usage not shown).
        """
        path = target.entry.mount_path
        key = (target.pod.pod_uid, target.spec.name)
        if not path or key in self._walking:
            return None  # a walk of it is still going on (a slow disk): not again
        walk = asyncio.ensure_future(
            asyncio.to_thread(disk_usage, path, DU_TIME_LIMIT_S, DU_MAX_ENTRIES)
        )
        self._walking.add(key)
        walk.add_done_callback(lambda done: self._walk_ended(key, done))
        try:  # a syscall hanging in the walk must not hold up the other volumes
            found = await asyncio.wait_for(
                asyncio.shield(walk), DU_TIME_LIMIT_S + STATVFS_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            log.debug("disk usage of {} failed: {}", path, exc or "it takes too long")
            return None
        over = found.bytes_used > limit
        message = size_limit_message(target.spec.name, limit) if over else ""
        if not found.complete and not over:
            return None, None, ""
        fs = await self._statvfs(path)
        usage = VolumeUsage(
            capacity_bytes=fs.capacity_bytes if fs else 0,
            available_bytes=fs.available_bytes if fs else 0,
            used_bytes=found.bytes_used,
            inodes=fs.inodes if fs else 0,
            inodes_free=fs.inodes_free if fs else 0,
            inodes_used=found.inodes_used,
            source=SOURCE_DU,
        )
        return (usage if found.complete else None), over, message

    def _walk_ended(self, key: PodVolumeKey, walk: asyncio.Future[DirUsage]) -> None:
        """A walk's thread finished (maybe after its caller gave up on it)."""
        self._walking.discard(key)
        if not walk.cancelled():
            walk.exception()  # retrieved: an error after a timeout is not reported again

    async def _statvfs(self, path: str) -> VolumeUsage | None:
        try:
            st = await asyncio.wait_for(asyncio.to_thread(os.statvfs, path), STATVFS_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            log.debug("statvfs {} failed: {}", path, exc)
            return None
        return usage_of_statvfs(st)

    def _request(self, target: _Target) -> VolumeRequest:
        """The plugin request of a mounted pod-volume, its paths as the mount recorded them."""
        spec, uid = target.spec, target.pod.pod_uid
        mount_path = target.entry.mount_path
        return VolumeRequest(
            volume_id=spec.volume_id,
            source=spec.source,
            volume_mode=spec.volume_mode,
            read_only=spec.read_only,
            size_bytes=spec.size_bytes,
            pod_uid=uid,
            volume_name=spec.name,
            mount_path=Path(mount_path) if mount_path else None,
            spec_name=spec.pv_name or spec.name,
            ephemeral=not spec.pv_name,
        )

    # ------------------------------------------------------------- the log

    async def _record_changes(
        self, target: _Target, usage: VolumeUsage | None, abnormal: bool | None, message: str
    ) -> None:
        """Append what changed since the log last said (see the module doc)."""
        key = (target.pod.pod_uid, target.spec.name)
        entry = self.asw.podvols.get(key)
        if entry is None or entry.state != MOUNTED:
            return
        bodies: list[Body] = []
        if abnormal is not None and _condition_changed(entry, abnormal, message):
            bodies.append(self._condition(target, abnormal, message))
        claim_usage = usage if target.spec.claim_name else None  # an emptyDir's is not logged
        if claim_usage and claim_usage.capacity_bytes > 0 and _usage_changed(entry, claim_usage):
            bodies.append(self._usage(target, claim_usage))
        if bodies:
            await self.recorder.record_async(podvol_stream(*key), bodies)

    def _condition(self, target: _Target, abnormal: bool, message: str) -> VolumeConditionChanged:
        pod, spec = target.pod, target.spec
        where = f"volume {spec.name} of pod {pod.namespace}/{pod.name}"
        limit = limited_empty_dir(spec)
        if abnormal:
            log.warning("{}: volume condition abnormal: {}", where, message or "no message")
        elif limit is not None:
            shown = quantity_text(limit)
            log.info('{}: usage of EmptyDir volume "{}" is under the limit "{}" again', where,
                     spec.name, shown)  # fmt: skip
        else:
            log.info("{}: volume condition normal again", where)
        return VolumeConditionChanged(
            volume_id=spec.volume_id,
            pod_uid=pod.pod_uid,
            volume_name=spec.name,
            abnormal=abnormal,
            message=message if abnormal else "",
            namespace=pod.namespace,
            claim=spec.claim_name,
        )

    def _usage(self, target: _Target, usage: VolumeUsage) -> VolumeUsageChanged:
        pod, spec = target.pod, target.spec
        return VolumeUsageChanged(
            volume_id=spec.volume_id,
            pod_uid=pod.pod_uid,
            volume_name=spec.name,
            namespace=pod.namespace,
            claim=spec.claim_name,
            capacity_bytes=usage.capacity_bytes,
            available_bytes=usage.available_bytes,
            used_bytes=usage.used_bytes,
            inodes=usage.inodes,
            inodes_free=usage.inodes_free,
            inodes_used=usage.inodes_used,
            source=usage.source,
        )

    # ------------------------------------------------------------- queries

    def by_claim(self) -> list[VolumeStats]:
        """One entry per (namespace, claim), the first pod's (kubelet: "first pod wins")."""
        seen: dict[tuple[str, str], VolumeStats] = {}
        for stats in self.stats.values():
            if stats.claim:
                seen.setdefault((stats.namespace, stats.claim), stats)
        return list(seen.values())

    def empty_dirs(self) -> list[VolumeStats]:
        """The last measurement of each disk-backed emptyDir with a sizeLimit."""
        return [s for s in self.stats.values() if s.size_limit_bytes is not None]

    def of_volume(self, volume_id: str) -> VolumeStats | None:
        """The first pod's stats of a volume (None if none gathered)."""
        first = next(iter(self._holders.get(volume_id) or ()), None)
        return self.stats.get(first) if first is not None else None

    def _drop(self, key: PodVolumeKey) -> None:
        """Forget one pod-volume's stats."""
        stats = self.stats.pop(key, None)
        if stats is None:
            return
        holders = self._holders.get(stats.volume_id)
        if holders is not None:
            holders.pop(key, None)
            if not holders:
                del self._holders[stats.volume_id]

    def of_pod_volume(self, pod_uid: str, volume_name: str) -> VolumeStats | None:
        """The stats of one pod-volume (None if none gathered)."""
        return self.stats.get((pod_uid, volume_name))


def _condition_changed(entry: PodVolumeState, abnormal: bool, message: str) -> bool:
    if abnormal != entry.abnormal:
        return True
    return abnormal and message != entry.condition


def _usage_changed(entry: PodVolumeState, usage: VolumeUsage) -> bool:
    if entry.capacity_bytes == 0:
        return usage.capacity_bytes > 0
    if usage.capacity_bytes != entry.capacity_bytes:
        return True
    recorded = VolumeUsage(capacity_bytes=entry.capacity_bytes, used_bytes=entry.used_bytes)
    return usage.step() != recorded.step()
