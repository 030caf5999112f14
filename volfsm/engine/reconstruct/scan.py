"""Scan the node: mountinfo, the pod volume dirs, and every plugin's global dirs.

Pod dirs are the kubelet's for every plugin (``pods/<uid>/volumes/<plugin~>/
<name>`` and ``pods/<uid>/volumeDevices/<plugin~>/<name>``); the dirs under
``plugins/`` are each plugin's own, so each plugin lists its own
(`SpecConstructor.scan_global_dirs`). What is not even a volume entry (a file
where a directory belongs, an unreadable or empty plugin dir) is junk: an
orphan to clean up.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger as log

from volfsm.node import mounts
from volfsm.node.layout import (
    PODS,
    VOLUME_DEVICES,
    VOLUMES,
    RootLayout,
    UnsafePathError,
    component_problem,
)
from volfsm.node.mounts import MountInfo
from volfsm.plugins.base import GlobalDir, PodVolumeDir, SpecConstructor, list_dir

EntryKey = tuple[str, str, str, str]
"""(pod uid, "volumes" or "volumeDevices", escaped plugin name, dir name): one pod volume dir."""


@dataclass(frozen=True, slots=True)
class Junk:
    """Something under the root dir that is not even a volume entry."""

    path: Path
    pod_uid: str
    """The pod dir it is in ("" outside one)."""
    why: str
    plugin: str = ""
    """The plugin whose global dir holds it ("" in a pod dir)."""


@dataclass
class NodeScan:
    """What the node has: mounts, pod dirs and their volume entries, plugins' global dirs."""

    infos: list[MountInfo] = field(default_factory=list)
    mounted: dict[str, MountInfo] = field(default_factory=dict)
    pod_uids: list[str] = field(default_factory=list)
    entries: list[PodVolumeDir] = field(default_factory=list)
    global_dirs: list[GlobalDir] = field(default_factory=list)
    junk: list[Junk] = field(default_factory=list)

    def mount_at(self, path: Path | str) -> MountInfo | None:
        """The topmost mount exactly at `path`."""
        return self.mounted.get(os.fspath(path))

    def mounts_under(self, path: Path | str) -> list[str]:
        """Mount points at or under `path`."""
        return [i.mount_point for i in mounts.mounts_under(path, self.infos)]


def scan_node(layout: RootLayout, plugins: Iterable[SpecConstructor]) -> NodeScan:
    """Read /proc/self/mountinfo, walk pods/ and each plugin's global dirs (blocking)."""
    scan = NodeScan()
    scan.infos = mounts.read_mountinfo()
    for info in scan.infos:
        scan.mounted[info.mount_point] = info  # later lines are stacked on top
    _scan_pods(layout, scan)
    for plugin in plugins:
        found = plugin.scan_global_dirs(layout)
        scan.global_dirs.extend(found.dirs)
        scan.junk.extend(Junk(path, "", why, plugin.name) for path, why in found.junk)
    return scan


def _scan_pods(layout: RootLayout, scan: NodeScan) -> None:
    try:
        pods = list_dir(layout, layout.pods_dir) or []
    except (UnsafePathError, OSError) as exc:
        log.error("cannot read {}: {}", layout.pods_dir, exc)
        return
    for uid, is_dir in pods:
        pod_dir = layout.pods_dir / uid
        problem = component_problem(uid)
        if not is_dir or problem is not None:
            why = "not a pod directory" if is_dir else "not a directory"
            scan.junk.append(Junk(pod_dir, "", why))
            continue
        scan.pod_uids.append(uid)
        for sub in (VOLUMES, VOLUME_DEVICES):
            _scan_pod_sub(layout, scan, uid, pod_dir / sub, sub)


def _scan_pod_sub(layout: RootLayout, scan: NodeScan, uid: str, sub_dir: Path, sub: str) -> None:
    try:
        plugins = list_dir(layout, sub_dir)
    except (UnsafePathError, OSError) as exc:
        scan.junk.append(Junk(sub_dir, uid, f"cannot be read as a directory: {exc}"))
        return
    for escaped, is_dir in plugins or []:
        plugin_dir = sub_dir / escaped
        if not is_dir:
            why = "a file or link where a plugin directory belongs"
            scan.junk.append(Junk(plugin_dir, uid, why))
            continue
        try:
            names = list_dir(layout, plugin_dir) or []
        except (UnsafePathError, OSError) as exc:
            scan.junk.append(Junk(plugin_dir, uid, f"cannot be read: {exc}"))
            continue
        if not names:
            scan.junk.append(Junk(plugin_dir, uid, "an empty plugin directory left over"))
        for name, entry_is_dir in names:
            scan.entries.append(
                PodVolumeDir(uid, sub, escaped, name, plugin_dir / name, is_dir=entry_is_dir)
            )


def entry_of(layout: RootLayout, path: Path | str) -> EntryKey | None:
    """The pod volume entry a path lies in (pods/<uid>/<sub>/<plugin>/<name>/...), or None."""
    if not path:
        return None
    try:
        parts = layout.relative_parts(path)
    except UnsafePathError:
        return None
    if len(parts) >= 5 and parts[0] == PODS and parts[2] in (VOLUMES, VOLUME_DEVICES):
        return (parts[1], parts[2], parts[3], parts[4])
    return None


def inside(layout: RootLayout, path: Path | str) -> bool:
    """Whether `path` lies below the root dir."""
    try:
        return bool(layout.relative_parts(path))
    except UnsafePathError:
        return False
