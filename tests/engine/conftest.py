"""Engine scenario fixtures: a log, a root dir, scripted plugins and a started engine.

When a test ends every engine it started is stopped; then the log must
validate and folding it must give exactly the live ASW of the last engine
(a restart scenario checks the earlier ones itself).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from events.log import EventLog
from projections.asw import Asw, fold
from tests.helpers.logcheck import assert_log_matches
from volfsm.engine import EngineConfig, VolumeEngine
from volfsm.node import mounts
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.scripted import ScriptedPlugin

FAST = EngineConfig(
    reconcile_period=0.01,
    full_resync_period=5.0,
    backoff_initial=0.01,
    backoff_max=0.08,
    operation_timeout=0.5,
    wait_for_attach_timeout=0.5,
)
"""Short period, backoff and timeouts for scenarios (no test asserts a wall-clock time)."""

EngineFactory = Callable[..., Awaitable[VolumeEngine]]


def asw_of(log: EventLog) -> Asw:
    """The ASW folded from the whole log."""
    return fold(log.read_after(0))


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """The engine's root dir; loops and mounts left under it are removed at the end.

    Order matters after a failed block test: the fd-lock loop (backed by the
    bind-mounted global map file) goes while its backing path is still
    visible, then the mounts, then the plugin's own loops (which a busy
    detach only marked for autoclear).
    """
    path = tmp_path / "root"
    path.mkdir()
    yield path
    _detach_loops_under(tmp_path)
    for info in mounts.mounts_under(path):
        try:
            mounts.umount(info.mount_point)
        except mounts.MountError:
            mounts.umount(info.mount_point, lazy=True)
    _detach_loops_under(tmp_path)
    assert not mounts.mounts_under(path), "mounts left under the root dir"


def _detach_loops_under(path: Path) -> None:
    """Detach every loop device whose backing file lies under `path`."""
    out = subprocess.run(
        ["losetup", "-a", "-n", "-O", "NAME,BACK-FILE"], capture_output=True, text=True
    )
    for line in out.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip().startswith(f"{path}/"):
            subprocess.run(["losetup", "-d", parts[0]], capture_output=True)


@pytest.fixture
def event_log(tmp_path: Path) -> Iterator[EventLog]:
    """A fresh log (closed at the end)."""
    log = EventLog(tmp_path / "volfsm.db", node="node-1")
    yield log
    log.close()


@pytest.fixture
def plugin() -> Iterator[ScriptedPlugin]:
    """A plain scripted CSI driver (neither attachable nor device-mountable)."""
    p = ScriptedPlugin()
    yield p
    p.cleanup()


def catalog_of(*plugins: ScriptedPlugin) -> PluginCatalog:
    """A catalog serving each scripted plugin under its driver name."""
    catalog = PluginCatalog()
    for p in plugins:
        catalog.register_csi_driver(p.driver, p)
    return catalog


@pytest.fixture
async def make_engine(event_log: EventLog, root: Path) -> AsyncIterator[EngineFactory]:
    """Start engines on the test's log and root; each is stopped and checked at the end."""
    started: list[VolumeEngine] = []
    extra_plugins: list[ScriptedPlugin] = []

    async def factory(
        *plugins: ScriptedPlugin, config: EngineConfig = FAST, catalog: PluginCatalog | None = None
    ) -> VolumeEngine:
        extra_plugins.extend(plugins)
        engine = VolumeEngine(event_log, root, catalog or catalog_of(*plugins), config)
        await engine.start()
        started.append(engine)
        return engine

    yield factory
    for engine in started:
        await engine.stop(grace_s=1.0)
    for p in extra_plugins:
        with contextlib.suppress(Exception):
            p.cleanup()
    if started:
        assert_log_matches(started[-1])
