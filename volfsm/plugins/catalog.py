"""The plugin catalog: which plugin serves a volume source (kubelet's VolumePluginMgr).

Plugins are registered by their fully qualified name. CSI volumes all carry
the plugin name "kubernetes.io/csi" and are told apart by driver: a CSI
plugin instance is registered per driver name (kubelet's CSI driver
registration), and `find` picks it by ``source.driver``.

Reconstruction asks `spec_constructors`: one per plugin name, the CSI one
(`CsiVolumes`) always, like the kubelet's CSI plugin, which reads a volume's
``vol_data.json`` back whether or not its driver has registered yet.
"""

from __future__ import annotations

from events.types import VolumeSource
from volfsm.node.layout import CSI_PLUGIN
from volfsm.plugins.base import (
    ErrorClass,
    NotRegistered,
    PluginError,
    SpecConstructor,
    VolumePlugin,
)
from volfsm.plugins.csi.construct import CsiVolumes

PLUGIN_NOT_FOUND = "PluginNotFound"


class PluginCatalog:
    """Registered volume plugins and CSI drivers."""

    def __init__(self) -> None:
        self._plugins: dict[str, VolumePlugin] = {}
        self._csi_drivers: dict[str, VolumePlugin] = {}
        self._csi_volumes = CsiVolumes()

    def register(self, plugin: VolumePlugin) -> None:
        """Add a plugin under `plugin.name`; `ValueError` if the name is empty or taken.

        CSI plugins are registered per driver with `register_csi_driver`.
        """
        if not plugin.name:
            raise ValueError(f"plugin {plugin!r} has no name")
        if plugin.name == CSI_PLUGIN:
            raise ValueError("register CSI plugins per driver with register_csi_driver()")
        if plugin.name in self._plugins:
            raise ValueError(f"plugin {plugin.name!r} is already registered")
        self._plugins[plugin.name] = plugin

    def register_csi_driver(self, driver_name: str, plugin: VolumePlugin) -> None:
        """Serve CSI volumes of `driver_name` with `plugin` (replacing an earlier registration,
        as kubelet does when a driver re-registers)."""
        if not driver_name:
            raise ValueError("CSI driver name must not be empty")
        self._csi_drivers[driver_name] = plugin

    def unregister_csi_driver(self, driver_name: str) -> None:
        """Forget a CSI driver (its socket went away). Unknown names are ignored."""
        self._csi_drivers.pop(driver_name, None)

    def plugin_names(self) -> list[str]:
        """Names of the registered (non-CSI) plugins, sorted."""
        return sorted(self._plugins)

    def csi_driver_names(self) -> list[str]:
        """Names of the registered CSI drivers, sorted."""
        return sorted(self._csi_drivers)

    def spec_constructors(self) -> list[SpecConstructor]:
        """The reconstruction hooks of every plugin name: CSI's, then the registered ones."""
        return [self._csi_volumes, *(self._plugins[name] for name in sorted(self._plugins))]

    def find(self, source: VolumeSource) -> VolumePlugin:
        """The plugin serving `source`; PluginError("PluginNotFound", TRANSIENT) if none.

        TRANSIENT because nothing was attempted: kubelet retries the plugin
        lookup with backoff, and a CSI driver may register later.
        """
        if source.plugin == CSI_PLUGIN:
            if not source.driver:
                raise PluginError(
                    PLUGIN_NOT_FOUND, "CSI volume source names no driver", ErrorClass.TRANSIENT
                )
            plugin = self._csi_drivers.get(source.driver)
            if plugin is None:
                raise PluginError(
                    PLUGIN_NOT_FOUND,
                    f"CSI driver {source.driver!r} is not registered "
                    f"(registered: {', '.join(self.csi_driver_names()) or 'none'})",
                    ErrorClass.TRANSIENT,
                )
        else:
            found = self._plugins.get(source.plugin)
            if found is None:
                raise PluginError(
                    PLUGIN_NOT_FOUND,
                    f"no volume plugin {source.plugin!r} "
                    f"(registered: {', '.join(self.plugin_names()) or 'none'})",
                    ErrorClass.TRANSIENT,
                )
            plugin = found
        if not plugin.supports(source):
            raise PluginError(
                PLUGIN_NOT_FOUND,
                f"plugin {plugin.name!r} does not support this {source.plugin} source",
                ErrorClass.TRANSIENT,
            )
        return plugin

    def can_serve(self, source: VolumeSource, volume_mode: str) -> str | None:
        """None if a registered plugin can serve `source` in `volume_mode`, else why not
        (a `NotRegistered` when it is a CSI volume of a driver not registered yet)."""
        if source.plugin == CSI_PLUGIN and source.driver and source.driver not in self._csi_drivers:
            return NotRegistered(f"CSI driver {source.driver}: not registered on this node yet")
        try:
            plugin = self.find(source)
        except PluginError as exc:
            return exc.message
        return plugin.can_serve(source, volume_mode)
