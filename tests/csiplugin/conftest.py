"""Fixtures for the CSI plugin tests: real drivers, a root dir, started plugins, cleanup.

Every driver, plugin and hostile server a test starts is stopped when it
ends, and every mount and loop device under its tmp_path is removed even
if it failed. A test that passed but left a mount, loop device or driver
process behind fails in teardown; the session ends with a final check.
The driver fixtures and those checks are shared with the other CSI suites
(tests/helpers/csidriver.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.csiplugin.hostile import HostileDriver
from tests.helpers import csidriver as shared
from tests.helpers.csidriver import Closeable, DriverProcess, StartDriver
from volfsm.node.layout import RootLayout
from volfsm.plugins.csi.plugin import CsiPlugin

DRIVER = "csi.volfsm.dev"
NODE = "node-1"
"""The node id the plugins use; DriverProcess starts drivers with this node id too."""

MakePlugin = Callable[..., Awaitable[CsiPlugin]]

__all__ = ["DRIVER", "NODE", "MakePlugin", "StartDriver"]

pytest_runtest_makereport = shared.remember_reports
_nothing_left_behind = shared.nothing_left_behind
janitor = shared.janitor_fixture
start_driver = shared.start_driver_fixture


@pytest.fixture
def driver(start_driver: StartDriver) -> DriverProcess:
    """The driver with default options (STAGE_UNSTAGE, stats, expand)."""
    return start_driver()


@pytest.fixture
def hostile(janitor: list[Closeable]) -> HostileDriver:
    """A misbehaving CSI driver served in this process (see hostile.py)."""
    server = HostileDriver().start()
    janitor.append(server)
    return server


@pytest.fixture
def layout(tmp_path: Path) -> RootLayout:
    """The kubelet-style root dir."""
    root = tmp_path / "root"
    root.mkdir()
    return RootLayout(root)


@pytest.fixture
async def make_plugin(layout: RootLayout) -> AsyncIterator[MakePlugin]:
    """Started CsiPlugins for an endpoint (channels closed at the end)."""
    plugins: list[CsiPlugin] = []

    async def make(endpoint: str, *, start: bool = True, **kwargs: Any) -> CsiPlugin:
        kwargs.setdefault("node_name", NODE)
        kwargs.setdefault("timeout_s", 30.0)
        kwargs.setdefault("socket_wait_s", 5.0)
        driver_name = kwargs.pop("driver", DRIVER)
        plugin = CsiPlugin(driver_name, endpoint, layout, **kwargs)
        plugins.append(plugin)
        if start:
            await plugin.start()
        return plugin

    yield make
    for plugin in plugins:
        await plugin.stop()


@pytest.fixture
async def plugin(driver: DriverProcess, make_plugin: MakePlugin) -> CsiPlugin:
    """A plugin started against the default driver."""
    return await make_plugin(driver.endpoint)
