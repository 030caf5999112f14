"""Fixtures: volfsm's CSI driver as a process, and a VolumeEngine driving it through CsiPlugin.

A "stack" is what `volfsm serve` runs for one CSI driver: an event log, a
kubelet-style root dir, a `CsiPlugin` for the driver's socket registered in
the plugin catalog, and a started `VolumeEngine`. Teardown always runs, in
this order: engines stopped (in-flight calls cancelled after a short
grace), plugin channels closed, logs closed; then the janitor stops every
driver and hostile server and unmounts / detaches everything under the
test's tmp_path. A test that passed but left a mount, loop device or
driver process behind fails in teardown; a passing test's log must also be
a legal story that folds to the engine's live state. The session ends with
a final check scoped to this session's temp dirs and the drivers it started.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from events.log import EventLog
from tests.enginecsi.helpers import DRIVER, NODE
from tests.enginecsi.hostile_raw import RawHostileDriver
from tests.helpers import csidriver as shared
from tests.helpers.csidriver import Closeable, DriverProcess, StartDriver, call_passed
from tests.helpers.logcheck import assert_log_matches
from volfsm.engine import EngineConfig, VolumeEngine
from volfsm.node.layout import RootLayout
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.csi.plugin import CsiPlugin

__all__ = ["FAST", "MakeStack", "Stack", "StartDriver"]

pytest_runtest_makereport = shared.remember_reports
_nothing_left_behind = shared.nothing_left_behind
janitor = shared.janitor_fixture
start_driver = shared.start_driver_fixture

FAST = EngineConfig(
    reconcile_period=0.02,
    full_resync_period=5.0,
    backoff_initial=0.05,
    backoff_factor=2.0,
    backoff_max=0.8,
    operation_timeout=120.0,
)
"""Quick reconcile and short backoff; plugin calls bounded by the CSI timeout (no test
asserts a wall-clock time, and the machine may be slow: mkfs of a fresh volume)."""

CSI_TIMEOUT_S = 60.0
"""The plugin's per-call deadline unless a test sets a short one."""


@dataclass
class Stack:
    """One engine driving one CSI driver: what `volfsm serve --csi NAME=ENDPOINT` runs."""

    engine: VolumeEngine
    log: EventLog
    plugin: CsiPlugin
    layout: RootLayout
    driver: DriverProcess | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        """The engine's root dir."""
        return self.layout.root


MakeStack = Callable[..., Awaitable[Stack]]


@pytest.fixture
def driver(start_driver: StartDriver) -> DriverProcess:
    """volfsm's CSI driver with default options (stage/unstage, expand, stats)."""
    return start_driver()


@pytest.fixture
def hostile(janitor: list[Closeable]) -> RawHostileDriver:
    """A misbehaving CSI driver served in this process (tests/csiplugin/hostile.py)."""
    server = RawHostileDriver(DRIVER).start()
    janitor.append(server)
    return server


@pytest.fixture
async def make_stack(
    request: pytest.FixtureRequest, tmp_path: Path, janitor: list[Closeable]
) -> AsyncIterator[MakeStack]:
    """Build started stacks on a driver (or any endpoint); all torn down at the end."""
    stacks: list[Stack] = []

    async def make(
        target: DriverProcess | RawHostileDriver | str,
        *,
        csi_timeout: float = CSI_TIMEOUT_S,
        config: EngineConfig = FAST,
        start_plugin: bool = True,
        driver_name: str = DRIVER,
    ) -> Stack:
        endpoint = target if isinstance(target, str) else target.endpoint
        n = len(stacks)
        root = tmp_path / ("root" if n == 0 else f"root{n}")
        root.mkdir()
        layout = RootLayout(root)
        log = EventLog(tmp_path / ("volfsm.db" if n == 0 else f"volfsm{n}.db"), node=NODE)
        plugin = CsiPlugin(
            driver_name, endpoint, layout, node_name=NODE, timeout_s=csi_timeout, socket_wait_s=10
        )
        catalog = PluginCatalog()
        catalog.register_csi_driver(driver_name, plugin)
        engine = VolumeEngine(log, root, catalog, config)
        stack = Stack(
            engine=engine,
            log=log,
            plugin=plugin,
            layout=layout,
            driver=target if isinstance(target, DriverProcess) else None,
        )
        stacks.append(stack)
        if start_plugin:
            await plugin.start()
        await engine.start()
        return stack

    try:
        yield make
    finally:
        for stack in reversed(stacks):
            try:
                await stack.engine.stop(grace_s=2.0)
            finally:
                await stack.plugin.stop()
        try:
            if call_passed(request.node):
                for stack in stacks:
                    assert_log_matches(stack.engine)
        finally:
            for stack in stacks:
                stack.log.close()


@pytest.fixture
async def stack(driver: DriverProcess, make_stack: MakeStack) -> Stack:
    """An engine driving the default driver."""
    return await make_stack(driver)
