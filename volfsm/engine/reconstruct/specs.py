"""Recover specs through the plugins: each entry goes to the plugin that owns its dir.

The engine knows no volume type: a pod volume dir goes to the plugin whose
escaped name is its dir's (`SpecConstructor.pod_dir_name`), a global dir to
the plugin that listed it, a volume id to whichever plugin recognises it. An
entry no plugin owns cannot be reconstructed ("unknown volume plugin").
"""

from __future__ import annotations

from collections.abc import Iterable

from events.types import DesiredVolume, VolumeSource
from volfsm.engine.reconstruct.scan import EntryKey, NodeScan
from volfsm.node.layout import (
    VOLUME_DEVICES,
    VOLUMES,
    RootLayout,
    UnsafePathError,
    escape_plugin_name,
    unescape_plugin_name,
)
from volfsm.plugins.base import (
    BLOCK,
    ConstructedSpec,
    GlobalDir,
    PodVolumeDir,
    SpecConstructor,
)


class PluginSpecs:
    """The plugins' reconstruction hooks, by plugin name and by pod dir name."""

    def __init__(self, layout: RootLayout, plugins: Iterable[SpecConstructor]) -> None:
        self.layout = layout
        self.plugins = list(plugins)
        self.by_name = {p.name: p for p in self.plugins}
        self.by_dir = {p.pod_dir_name(): p for p in self.plugins}

    def construct(self, entry: PodVolumeDir, scan: NodeScan) -> ConstructedSpec | str:
        """The spec of a pod volume dir, by the plugin owning it; or why it has none."""
        plugin = self.by_dir.get(entry.escaped)
        if plugin is None:
            return f"unknown volume plugin {unescape_plugin_name(entry.escaped)!r}"
        if entry.block:
            return plugin.construct_block_volume_spec(self.layout, entry, scan)
        return plugin.construct_volume_spec(self.layout, entry, scan)

    def construct_device(self, entry: GlobalDir) -> ConstructedSpec | str:
        """The spec of a global dir, by the plugin that listed it."""
        plugin = self.by_name.get(entry.plugin)
        if plugin is None:
            return f"unknown volume plugin {entry.plugin!r}"
        return plugin.construct_device_spec(self.layout, entry)

    def from_volume_id(self, volume_id: str, pod_uid: str, name: str) -> DesiredVolume | None:
        """A pod-volume's spec from its volume id, by the first plugin that knows it."""
        for plugin in self.plugins:
            spec = plugin.spec_from_volume_id(volume_id, pod_uid, name)
            if spec is not None:
                return spec
        return None

    def device_from_volume_id(self, volume_id: str, device_mount_path: str) -> DesiredVolume | None:
        """A staged volume's spec from its id and device mount path, or None."""
        for plugin in self.plugins:
            spec = plugin.device_spec_from_volume_id(self.layout, volume_id, device_mount_path)
            if spec is not None:
                return spec
        return None

    def is_device_mountable(self, source: VolumeSource) -> bool:
        """Whether the plugin of `source` stages its volumes (False for an unknown one)."""
        plugin = self.by_name.get(source.plugin)
        return plugin is not None and plugin.is_device_mountable(source)

    def expected_pod_mount(self, spec: DesiredVolume) -> str | None:
        """What the plugin itself mounts at the pod's path (see `SpecConstructor`)."""
        plugin = self.by_name.get(spec.source.plugin)
        return plugin.expected_pod_mount(spec) if plugin is not None else None

    def plugin_for(
        self, spec: DesiredVolume | None, entry: EntryKey | None
    ) -> SpecConstructor | None:
        """The plugin of a spec, else of the pod volume dir `entry`; None if unknown."""
        if spec is not None:
            return self.by_name.get(spec.source.plugin)
        return self.by_dir.get(entry[2]) if entry is not None else None

    def default_entry(self, pod_uid: str, dv: DesiredVolume) -> EntryKey | None:
        """Where the kubelet keeps a pod's volume: pods/<uid>/<sub>/<plugin~>/<dir name>."""
        try:
            escaped = escape_plugin_name(dv.source.plugin)
        except UnsafePathError:
            return None
        plugin = self.by_name.get(dv.source.plugin)
        sub = VOLUME_DEVICES if dv.volume_mode == BLOCK else VOLUMES
        name = plugin.volume_dir_name(dv) if plugin is not None else dv.name
        return (pod_uid, sub, escaped, name)
