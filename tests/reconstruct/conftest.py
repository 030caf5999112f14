"""Fixtures for reconstruction: one node (root dir + log file) restarted as often as a test likes.

`Node.start()` opens the log and starts a `VolumeEngine` with the real
emptyDir plugin (tmpfs for medium Memory; hostPath and local if asked) and,
when given, volfsm's CSI driver through `CsiPlugin` or a scripted plugin. `Node.stop()` stops it
like a clean shutdown (nothing is unmounted); `Node.lose_log()` deletes the
log files. Whatever a test does, at its end every engine is stopped, every
log closed, every mount under the test's tmp dir unmounted, every loop
device on a file under it detached and every `chattr +i` it set undone;
then no mount may be left under the root dir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from events.log import EventLog
from tests.engine.conftest import FAST, _detach_loops_under
from tests.helpers import csidriver as shared
from tests.helpers.csidriver import Closeable, DriverProcess, StartDriver, call_passed
from tests.helpers.logcheck import assert_log_matches
from volfsm.engine import EngineConfig, VolumeEngine
from volfsm.node import mounts
from volfsm.node.layout import RootLayout
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.csi.plugin import CsiPlugin
from volfsm.plugins.emptydir import EmptyDirPlugin
from volfsm.plugins.hostpath import HostPathPlugin
from volfsm.plugins.local import HOSTNAME_LABEL, LocalVolumePlugin
from volfsm.plugins.scripted import ScriptedPlugin

NODE = "node-1"
CSI_DRIVER = "csi.volfsm.dev"

GATED = dataclasses.replace(FAST, desired_complete=False)
"""As `volfsm serve` starts, but with no grace: nothing is unmounted until told."""

pytest_runtest_makereport = shared.remember_reports
_nothing_left_behind = shared.nothing_left_behind
janitor = shared.janitor_fixture
start_driver = shared.start_driver_fixture


def with_grace(seconds: float) -> EngineConfig:
    """Incomplete at start; complete by itself `seconds` after the loop starts."""
    return dataclasses.replace(FAST, desired_complete=False, desired_grace=seconds)


class Node:
    """A root dir and a log path that engines are started on, one after the other."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.root = tmp_path / "root"
        self.root.mkdir()
        self.layout = RootLayout(self.root)
        self.db = tmp_path / "volfsm.db"
        self.engine: VolumeEngine | None = None
        self.log: EventLog | None = None
        self.csi: CsiPlugin | None = None
        self.immutable: list[Path] = []
        """Paths a test made immutable with chattr +i (undone at the end)."""
        self.plugins: list[ScriptedPlugin] = []
        """Scripted plugins whose loop devices go after the mounts (`cleanup`)."""

    async def start(
        self,
        config: EngineConfig = FAST,
        *,
        driver: DriverProcess | None = None,
        scripted: ScriptedPlugin | None = None,
        host: bool = False,
    ) -> VolumeEngine:
        """Open the log and start an engine with emptyDir (+ the CSI driver / scripted: as a
        CSI driver, or under its own plugin name; + hostPath and local with `host`)."""
        assert self.engine is None, "stop the running engine first"
        self.log = EventLog(self.db, node=NODE)
        catalog = PluginCatalog()
        catalog.register(EmptyDirPlugin(self.layout))
        if host:
            catalog.register(HostPathPlugin(self.layout))
            catalog.register(LocalVolumePlugin(self.layout, {HOSTNAME_LABEL: NODE}))
        if driver is not None:
            self.csi = CsiPlugin(
                CSI_DRIVER, driver.endpoint, self.layout, node_name=NODE, timeout_s=60.0
            )
            await self.csi.start()
            catalog.register_csi_driver(CSI_DRIVER, self.csi)
        if scripted is not None:
            if scripted.own:
                catalog.register(scripted)
            else:
                catalog.register_csi_driver(scripted.driver, scripted)
            if scripted not in self.plugins:
                self.plugins.append(scripted)
        self.engine = VolumeEngine(self.log, self.root, catalog, config)
        await self.engine.start()
        return self.engine

    async def stop(self, *, check: bool = False) -> None:
        """Stop the engine (a clean shutdown: mounts stay) and close its log.

        With `check`, the stopped engine's log must be legal and fold to its state.
        """
        engine, self.engine = self.engine, None
        try:
            if engine is not None:
                await engine.stop(grace_s=2.0)
                if check:
                    assert_log_matches(engine)
        finally:
            if self.csi is not None:
                await self.csi.stop()
                self.csi = None
            if self.log is not None:
                self.log.close()
                self.log = None

    def lose_log(self) -> None:
        """Delete the log and its side files (the node's mounts and dirs stay)."""
        assert self.engine is None
        for path in self.tmp_path.glob(f"{self.db.name}*"):
            path.unlink()

    def make_immutable(self, path: Path) -> None:
        """chattr +i (undone by the fixture even if the test fails)."""
        subprocess.run(["chattr", "+i", str(path)], check=True)
        self.immutable.append(path)

    def undo_immutable(self) -> None:
        """chattr -i everything made immutable."""
        for path in self.immutable:
            subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)
        self.immutable.clear()

    def cleanup(self) -> None:
        """Undo chattr; detach loops, unmount, detach again (see tests/engine's root fixture).

        Order matters for block volumes: the fd-lock loop device (backed by a
        bind-mounted global map file) goes while its backing path is still
        visible, then the mounts, then the plugins' own loop devices.
        """
        self.undo_immutable()
        _detach_loops_under(self.tmp_path)
        for _ in range(3):
            found = mounts.mounts_under(self.tmp_path)
            if not found:
                break
            for info in found:
                try:
                    mounts.umount(info.mount_point)
                except mounts.MountError:
                    with contextlib.suppress(mounts.MountError):
                        mounts.umount(info.mount_point, lazy=True)
        for plugin in self.plugins:
            plugin.cleanup()
        _detach_loops_under(self.tmp_path)
        shared.cleanup_under(self.tmp_path)


@pytest.fixture
async def node(
    request: pytest.FixtureRequest, tmp_path: Path, janitor: list[Closeable]
) -> AsyncIterator[Node]:
    """One node; at the end: engine stopped, log checked (if the test passed), all cleaned."""
    n = Node(tmp_path)
    try:
        yield n
    finally:
        try:
            await n.stop(check=call_passed(request.node))
        finally:
            n.cleanup()
            assert not mounts.mounts_under(n.root), "mounts left under the root dir"


@pytest.fixture
def driver(start_driver: StartDriver) -> DriverProcess:
    """volfsm's CSI driver (stage/unstage, expand), stopped and cleaned up at the end."""
    return start_driver()


@pytest.fixture
def scripted() -> Iterator[ScriptedPlugin]:
    """A scripted CSI-looking plugin (no real mounts)."""
    plugin = ScriptedPlugin()
    yield plugin
    plugin.cleanup()


def objects_of(*items: Any) -> list[dict[str, Any]]:
    """Flatten objects and lists of objects."""
    out: list[dict[str, Any]] = []
    for item in items:
        out.extend(item if isinstance(item, list) else [item])
    return out
