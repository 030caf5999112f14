"""Fixtures for the CSI plugin tests: real drivers, a root dir, started plugins, cleanup.

Every driver, plugin and hostile server a test starts is stopped when it
ends, and every mount and loop device under its tmp_path is removed even
if it failed. A test that passed but left a mount, loop device or driver
process behind fails in teardown; the session ends with a final check.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.csiplugin.hostile import HostileDriver
from tests.helpers.csidriver import (
    DriverProcess,
    cleanup_under,
    leftovers_under,
    live_drivers,
    stop_all_drivers,
)
from volfsm.layout import RootLayout
from volfsm.plugins.csi.plugin import CsiPlugin

DRIVER = "csi.volfsm.dev"
NODE = "node-1"

StartDriver = Callable[..., DriverProcess]
MakePlugin = Callable[..., Awaitable[CsiPlugin]]


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Final check of the session: no driver process, mount or loop device is left."""
    yield
    base = tmp_path_factory.getbasetemp()
    stray = live_drivers()
    stop_all_drivers()
    found = cleanup_under(base)
    assert not stray, f"driver processes left running: {stray}"
    assert found.empty, f"left behind under {base}: {found}"
    assert leftovers_under(base).empty


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember each phase's outcome on the item, for the cleanup fixture."""
    report = yield
    setattr(item, f"_csiplugin_{report.when}", report)
    return report


@pytest.fixture
def janitor(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[Any]]:
    """Stops what tests register (drivers, hostile servers), then cleans tmp_path.

    Cleanup always runs; a passing test that left something fails here.
    """
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        thing.close()
    found = cleanup_under(tmp_path)
    assert leftovers_under(tmp_path).empty, f"cleanup failed under {tmp_path}"
    report = getattr(request.node, "_csiplugin_call", None)
    if report is not None and report.passed:
        assert found.empty, f"the test left mounts, loop devices or drivers: {found}"


@pytest.fixture
def start_driver(janitor: list[Any], tmp_path: Path) -> StartDriver:
    """Start volfsm's CSI driver (extra command-line flags as arguments)."""

    def start(*extra_args: str, **kwargs: Any) -> DriverProcess:
        kwargs.setdefault("node_id", NODE)
        drv = DriverProcess(tmp_path, extra_args=extra_args, **kwargs)
        janitor.append(drv)
        return drv.start()

    return start


@pytest.fixture
def driver(start_driver: StartDriver) -> DriverProcess:
    """The driver with default options (STAGE_UNSTAGE, stats, expand)."""
    return start_driver()


@pytest.fixture
def hostile(janitor: list[Any]) -> HostileDriver:
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
