"""The plugin catalog: lookup by plugin name, CSI lookup by driver, can_serve messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.types import VolumeSource
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import (
    BLOCK,
    FILESYSTEM,
    ErrorClass,
    MountResult,
    PluginError,
    VolumePlugin,
    VolumeRequest,
)
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.emptydir import EmptyDirPlugin


class FakeCsi(VolumePlugin):
    """A CSI-shaped plugin serving one driver, with block support."""

    name = "kubernetes.io/csi"

    def __init__(self, driver: str) -> None:
        self.driver = driver

    def supports(self, source: VolumeSource) -> bool:
        return source.plugin == self.name and source.driver == self.driver

    def supports_block(self, source: VolumeSource) -> bool:
        return True

    def pod_mount_path(self, root: Path, req: VolumeRequest) -> Path:
        return root

    async def set_up(self, req: VolumeRequest) -> MountResult:
        return MountResult()

    async def tear_down(self, req: VolumeRequest) -> None:
        return None


def csi(driver: str) -> VolumeSource:
    return VolumeSource(plugin="kubernetes.io/csi", driver=driver, volume_handle="h")


EMPTY = VolumeSource(plugin="kubernetes.io/empty-dir")


@pytest.fixture
def catalog(tmp_path: Path) -> PluginCatalog:
    cat = PluginCatalog()
    cat.register(EmptyDirPlugin(RootLayout(tmp_path)))
    return cat


def test_find_by_plugin_name(catalog: PluginCatalog) -> None:
    assert catalog.find(EMPTY).name == "kubernetes.io/empty-dir"
    assert catalog.plugin_names() == ["kubernetes.io/empty-dir"]


def test_csi_sources_are_found_by_driver_name(catalog: PluginCatalog) -> None:
    a, b = FakeCsi("a.csi.example.com"), FakeCsi("b.csi.example.com")
    catalog.register_csi_driver("a.csi.example.com", a)
    catalog.register_csi_driver("b.csi.example.com", b)
    assert catalog.find(csi("a.csi.example.com")) is a
    assert catalog.find(csi("b.csi.example.com")) is b
    assert catalog.csi_driver_names() == ["a.csi.example.com", "b.csi.example.com"]


def test_a_re_registered_driver_replaces_the_old_one_and_can_be_removed(
    catalog: PluginCatalog,
) -> None:
    old, new = FakeCsi("d"), FakeCsi("d")
    catalog.register_csi_driver("d", old)
    catalog.register_csi_driver("d", new)
    assert catalog.find(csi("d")) is new
    catalog.unregister_csi_driver("d")
    catalog.unregister_csi_driver("d")
    with pytest.raises(PluginError):
        catalog.find(csi("d"))


@pytest.mark.parametrize(
    ("src", "words"),
    [
        (VolumeSource(plugin="kubernetes.io/nfs"), "kubernetes.io/nfs"),
        (csi("unknown.csi.example.com"), "unknown.csi.example.com"),
        (VolumeSource(plugin="kubernetes.io/csi"), "no driver"),
    ],
)
def test_unknown_plugins_and_drivers_are_transient_plugin_not_found(
    catalog: PluginCatalog, src: VolumeSource, words: str
) -> None:
    with pytest.raises(PluginError) as info:
        catalog.find(src)
    assert info.value.code == "PluginNotFound"
    assert info.value.error_class is ErrorClass.TRANSIENT
    assert words in info.value.message
    message = catalog.can_serve(src, FILESYSTEM)
    assert message is not None and words in message


def test_a_driver_plugin_that_does_not_support_the_source_is_not_found(
    catalog: PluginCatalog,
) -> None:
    catalog.register_csi_driver("alias", FakeCsi("real-name"))
    with pytest.raises(PluginError, match="does not support"):
        catalog.find(csi("alias"))


def test_can_serve_asks_the_plugin_about_the_volume_mode(catalog: PluginCatalog) -> None:
    catalog.register_csi_driver("d", FakeCsi("d"))
    assert catalog.can_serve(EMPTY, FILESYSTEM) is None
    refused = catalog.can_serve(EMPTY, BLOCK)
    assert refused is not None and "Block" in refused
    assert catalog.can_serve(csi("d"), BLOCK) is None
    weird = catalog.can_serve(csi("d"), "Sideways")
    assert weird is not None and "Sideways" in weird
    medium = catalog.can_serve(
        VolumeSource(plugin="kubernetes.io/empty-dir", medium="HugePages"), FILESYSTEM
    )
    assert medium is not None and "HugePages" in medium


def test_registration_mistakes_are_refused(catalog: PluginCatalog, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="already registered"):
        catalog.register(EmptyDirPlugin(RootLayout(tmp_path)))
    with pytest.raises(ValueError, match="register_csi_driver"):
        catalog.register(FakeCsi("d"))
    with pytest.raises(ValueError, match="empty"):
        catalog.register_csi_driver("", FakeCsi(""))
