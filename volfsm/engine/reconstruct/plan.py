"""What reconstruction reads (`Context`) and what it decides to record (`Plan`).

Every step reads the log's folds and the node and adds to one `Plan`: the
transitions to fire, the operation records to append, the specs to hand to
the reconciler and the report. Nothing is written until the whole plan is
made (`Reconstructor.run`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from events.log import EventLog
from events.streams import device_stream, podvol_stream
from events.tables import GLOBALLY_MOUNTED, UNCERTAIN
from events.types import Body, DesiredVolume, DeviceMountUncertain, VolumeMountUncertain
from projections.asw import Asw
from volfsm.engine.index import EngineIndex
from volfsm.engine.operations import OperationGenerator
from volfsm.engine.reconstruct.orphans import ORPHAN_STREAM_PREFIX, Orphan
from volfsm.engine.reconstruct.report import ReconstructionReport
from volfsm.engine.reconstruct.scan import EntryKey, entry_of
from volfsm.engine.reconstruct.specs import PluginSpecs
from volfsm.node.layout import RootLayout, UnsafePathError, component_problem
from volfsm.plugins.base import SpecConstructor

PodVolumeKey = tuple[str, str]
"""(pod uid, volume name)"""

STAGED = (GLOBALLY_MOUNTED, UNCERTAIN)
"""Device states in which something may be staged on the node."""


class SpecRegistry(Protocol):
    """Where reconstructed specs go, and who cleans pod dirs (the reconciler)."""

    reconstructed: dict[PodVolumeKey, DesiredVolume]
    reconstructed_devices: dict[str, DesiredVolume]

    def queue_pod_cleanup(self, uid: str) -> None:
        """Remove the pod's dir once it holds nothing and is not desired."""

    def wake(self) -> None:
        """Run a pass now."""

    def volume_spec(self, volume_id: str) -> DesiredVolume | None:
        """A volume's spec (from the log, else as reconstruction rebuilt it)."""


class SpecConstructors(Protocol):
    """Who hands out the plugins' reconstruction hooks (the plugin catalog)."""

    def spec_constructors(self) -> list[SpecConstructor]:
        """One per plugin name."""


@dataclass
class Context:
    """What every step reads: the log and its folds, the plugins, the node's layout."""

    log: EventLog
    asw: Asw
    index: EngineIndex
    ops: OperationGenerator
    layout: RootLayout
    registry: SpecRegistry
    plugins: SpecConstructors

    _specs: PluginSpecs | None = None

    def specs(self, *, refresh: bool = False) -> PluginSpecs:
        """The plugins' hooks (as registered when last refreshed: each run refreshes)."""
        if refresh or self._specs is None:
            self._specs = PluginSpecs(self.layout, self.plugins.spec_constructors())
        return self._specs

    def spec_of(self, uid: str, name: str) -> DesiredVolume | None:
        """The spec of a pod-volume: from the log (index), else as reconstructed."""
        return self.index.spec_of(uid, name) or self.registry.reconstructed.get((uid, name))

    def device_spec(self, volume_id: str) -> DesiredVolume | None:
        """A spec of a volume: from the log (index), else as reconstructed."""
        return self.index.volume_spec(volume_id) or self.registry.reconstructed_devices.get(
            volume_id
        )

    def entries_of(self, uid: str, dv: DesiredVolume) -> set[EntryKey]:
        """The pod volume dirs a spec can live in (the plugin's path, and the kubelet's)."""
        keys: set[EntryKey] = set()
        default = self.specs().default_entry(uid, dv)
        if default is not None:
            keys.add(default)
        paths = self.ops.request_paths(dv, uid)
        if paths is not None and paths[1] is not None:
            found = entry_of(self.layout, paths[1])
            if found is not None:
                keys.add(found)
        return keys

    def seen_mounted_at(self, stream: str, type_name: str) -> int | None:
        """The seq of the stream's last `type_name` event if it saw a mount after the call.

        None when there is no such event, or its `mount_found` was not True
        (nothing was seen, or nothing looked): a mount that was never seen
        cannot be missed.
        """
        for env in reversed(self.log.read_stream(stream)):
            if env.type == type_name:
                return env.seq if getattr(env.body, "mount_found", None) is True else None
        return None


@dataclass(frozen=True)
class Fire:
    """A transition to fire on a device (pod_uid "") or pod-volume stream."""

    volume_id: str
    pod_uid: str
    name: str
    trigger: str
    body: Body


@dataclass(frozen=True)
class Record:
    """Operation records to append."""

    stream: str
    body: Body


@dataclass
class Plan:
    """Every mark, record and spec reconstruction decided on, in order."""

    actions: list[Fire | Record] = field(default_factory=list)
    marked_devices: set[str] = field(default_factory=set)
    marked_podvols: set[PodVolumeKey] = field(default_factory=set)
    podvol_specs: dict[PodVolumeKey, DesiredVolume] = field(default_factory=dict)
    device_specs: dict[str, DesiredVolume] = field(default_factory=dict)
    report: ReconstructionReport = field(default_factory=ReconstructionReport)
    pod_uids: list[str] = field(default_factory=list)
    found_podvols: set[PodVolumeKey] = field(default_factory=set)
    found_devices: set[str] = field(default_factory=set)
    not_created: set[PodVolumeKey] = field(default_factory=set)
    """Held pod-volumes the log never recorded creating: their teardown keeps files."""

    def mark_podvol(self, uid: str, name: str, volume_id: str, reason: str, *, found: bool) -> None:
        """Mark a pod-volume Uncertain (`found`: on the node, not in the log)."""
        # Every mark made here is flagged reconstructed, whether the node showed the entry
        # (`found`) or the log knew it: as with the kubelet's reconstructed volumes, a final
        # error on the retry then leaves it Uncertain. An interrupted NodePublish may have
        # mounted; calling that Unmounted would leave the mount behind for good.
        body = VolumeMountUncertain(
            volume_id=volume_id, pod_uid=uid, volume_name=name, reason=reason, reconstructed=True
        )
        self.actions.append(Fire(volume_id, uid, name, "mark_uncertain", body))
        self.marked_podvols.add((uid, name))
        self.report.uncertain.append(f"{podvol_stream(uid, name)}: {reason}")
        self.report.reconstructed += found
        if found:
            self.found_podvols.add((uid, name))

    def mark_device(self, volume_id: str, reason: str, path: str, *, found: bool) -> None:
        """Mark a device Uncertain (`found`: on the node, not in the log)."""
        body = DeviceMountUncertain(  # reconstructed=True: see mark_podvol
            volume_id=volume_id, reason=reason, reconstructed=True, device_mount_path=path
        )
        self.actions.append(Fire(volume_id, "", "", "mark_device_uncertain", body))
        self.marked_devices.add(volume_id)
        self.report.uncertain.append(f"{device_stream(volume_id)}: {reason}")
        self.report.reconstructed += found
        if found:
            self.found_devices.add(volume_id)

    def orphan(
        self,
        layout: RootLayout,
        path: Path,
        why: str,
        *,
        uid: str = "",
        entry: EntryKey | None = None,
        plugin: str = "",
    ) -> None:
        """Report what cannot be reconstructed; its cleanup is recorded on a stream named
        by the pod dir entry (pod dirs) or by its path below the root (elsewhere)."""
        if uid and component_problem(path.name) is None:
            stream = podvol_stream(uid, path.name)
        else:
            try:
                where = "/".join(layout.relative_parts(path))
            except UnsafePathError:
                where = os.fspath(path)
            stream = device_stream(ORPHAN_STREAM_PREFIX + where)
        orphan = Orphan(os.fspath(path), why, stream, uid, entry, plugin=plugin)
        self.report.orphans.append(orphan)


OnFound = Callable[[int], None]
"""Called with how many found entries the log has no event of, before they are recorded."""
