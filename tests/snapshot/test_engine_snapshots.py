"""The engine writes snapshots while it runs and at a clean stop, and starts from them."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from events.log import EventLog
from events.streams import device_stream
from events.types import DeviceAttached, Envelope
from tests.engine.helpers import eventually
from tests.engine.objects import claim_volume, empty_dir_volume, pod, pv_set
from volfsm.engine import EngineConfig, VolumeEngine
from volfsm.engine.snapshot import KIND, SnapshotPolicy
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.emptydir import EmptyDirPlugin
from volfsm.plugins.scripted import ScriptedPlugin

from .histories import full_fold, state_view

FAST = EngineConfig(
    reconcile_period=0.01,
    full_resync_period=5.0,
    backoff_initial=0.01,
    backoff_max=0.08,
    operation_timeout=2.0,
    wait_for_attach_timeout=2.0,
)


class Node:
    """A log, a root dir and plugins; engines started on them are stopped at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "root"
        self.root.mkdir()
        self.log = EventLog(tmp_path / "volfsm.db", node="n1")
        self.plugin = ScriptedPlugin(device_mountable=True)
        self.engines: list[VolumeEngine] = []

    async def start(self, policy: SnapshotPolicy) -> VolumeEngine:
        catalog = PluginCatalog()
        catalog.register_csi_driver(self.plugin.driver, self.plugin)
        catalog.register(EmptyDirPlugin(_layout(self.root)))
        config = dataclasses.replace(FAST, snapshots=policy)
        engine = VolumeEngine(self.log, self.root, catalog, config)
        await engine.start()
        self.engines.append(engine)
        return engine

    async def close(self) -> None:
        for engine in self.engines:
            await engine.stop(grace_s=1.0)
        self.plugin.cleanup()
        self.log.close()


def _layout(root: Path) -> Any:
    from volfsm.node.layout import RootLayout

    return RootLayout(root)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    n = Node(tmp_path)
    try:
        yield n
    finally:
        await n.close()


def objects(n: int, start: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(start, start + n):
        out += pv_set(f"v{i}")
        out.append(pod(f"u{i}", claim_volume("data", f"v{i}"), empty_dir_volume("scratch")))
    return out


def assert_engine_is_the_fold(engine: VolumeEngine) -> None:
    """The engine's state is the full fold's, except for specs it already cleaned up.

    The index forgets a deleted pod (and a volume nobody wants) once the
    reconciler has cleaned it up; that is not logged, so a full fold still
    lists them (and the first pass after a full replay forgets them again).
    A snapshot keeps the engine's state, so it may list fewer, never others.
    """
    view = state_view((engine.asw, engine.dsw, engine.index))
    fold = state_view(full_fold(engine.log))
    for key in ("removed_pods", "removed_volumes"):
        live, folded = view.pop(key), dict(fold.pop(key))
        assert all(folded.get(k) == v for k, v in live), key
    assert view == fold


async def test_snapshots_are_written_every_n_events_and_used_at_restart(node: Node) -> None:
    first = await node.start(SnapshotPolicy(every_events=20, keep=2))
    assert first.snapshots.startup is not None
    assert first.snapshots.startup.snapshot is None
    await first.apply(objects(6))
    for i in range(6):
        await first.wait_pod(f"u{i}", "mounted", timeout=20)
    await first.settle()
    await first.snapshots.wait_saved()
    # Events come in batches and one save runs at a time: at least one was written.
    assert first.snapshots.stats.written >= 1, first.snapshots.stats
    assert first.snapshots.stats.failed == 0
    headers = node.log.snapshots.headers(KIND)
    assert 1 <= len(headers) <= 2  # keep=2
    await first.stop()
    last = node.log.last_seq()
    assert node.log.snapshots.headers(KIND)[0].seq == last  # the one written at stop

    second = await node.start(SnapshotPolicy(every_events=20, keep=2))
    startup = second.snapshots.startup
    assert startup is not None and startup.snapshot is not None
    assert startup.snapshot.seq == last and startup.events_replayed == 0
    assert f"state from snapshot #{startup.snapshot.id} at seq {last}" in second.snapshots.summary
    await second.settle()
    assert_engine_is_the_fold(second)
    for i in range(6):
        await second.wait_pod(f"u{i}", "mounted", timeout=20)


async def test_deleted_pods_survive_a_restart_from_a_snapshot(node: Node) -> None:
    first = await node.start(SnapshotPolicy(every_events=15))
    await first.apply(objects(4))
    for i in range(4):
        await first.wait_pod(f"u{i}", "mounted", timeout=20)
    await first.delete_pod(uid="u0")
    await first.delete_pod(uid="u1")
    await first.wait_pod("u0", "unmounted", timeout=20)
    await first.settle()
    await first.stop()
    second = await node.start(SnapshotPolicy(every_events=15))
    assert second.snapshots.startup is not None
    assert second.snapshots.startup.snapshot is not None
    await second.wait_pod("u1", "unmounted", timeout=20)
    await second.settle()
    assert_engine_is_the_fold(second)
    assert sorted(second.dsw.pods) == ["u2", "u3"]
    for i in (2, 3):
        await second.wait_pod(f"u{i}", "mounted", timeout=20)


async def test_a_restart_from_an_older_snapshot_replays_the_tail(node: Node) -> None:
    first = await node.start(SnapshotPolicy(every_events=10**9, at_stop=False))
    await first.apply(objects(3))
    await first.settle()
    assert await first.snapshots.snapshot_now()
    taken = first.snapshots.stats.last_seq
    await first.apply(objects(3, start=3))
    for i in range(6):
        await first.wait_pod(f"u{i}", "mounted", timeout=20)
    await first.settle()
    await first.stop()
    assert [h.seq for h in node.log.snapshots.headers(KIND)] == [taken]

    second = await node.start(SnapshotPolicy(every_events=10**9, at_stop=False))
    startup = second.snapshots.startup
    assert startup is not None and startup.snapshot is not None
    assert startup.snapshot.seq == taken
    assert startup.events_replayed == startup.last_seq - taken > 0
    await second.settle()
    assert_engine_is_the_fold(second)


async def test_no_snapshot_is_taken_while_an_event_is_missing(node: Node) -> None:
    engine = await node.start(SnapshotPolicy(every_events=10**9, at_stop=False))
    await engine.apply(objects(1))
    await engine.settle()
    writer = engine.snapshots
    ahead = node.log.last_seq() + 5  # as if an event were delivered before the four before it
    fake = Envelope(
        seq=ahead,
        stream=device_stream("x"),
        version=1,
        type="DeviceAttached",
        schema=1,
        ts=0,
        node="n1",
        body=DeviceAttached(volume_id="x", plugin="csi"),
    )
    writer._on_envelopes([fake])
    assert not await writer.snapshot_now()
    assert "reached the engine before" in writer.stats.waiting
    assert node.log.snapshots.headers(KIND) == []


async def test_a_failing_snapshot_write_does_not_stop_the_engine(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await node.start(SnapshotPolicy(every_events=5, at_stop=False))

    def broken(**_: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(node.log.snapshots, "save", broken)
    await engine.apply(objects(2))
    for i in range(2):
        await engine.wait_pod(f"u{i}", "mounted", timeout=20)
    await engine.snapshots.wait_saved()
    await eventually(lambda: engine.snapshots.stats.failed >= 1, "a failed snapshot write")
    assert "disk I/O error" in engine.snapshots.stats.last_error
    assert engine.alive
    monkeypatch.undo()
    assert await engine.snapshots.snapshot_now(), engine.snapshots.stats


async def test_snapshot_writing_can_be_turned_off(node: Node) -> None:
    engine = await node.start(SnapshotPolicy(write=False))
    await engine.apply(objects(2))
    await engine.settle()
    await engine.stop()
    assert node.log.snapshots.headers(KIND) == []
    again = await node.start(SnapshotPolicy(restore=False))
    assert again.snapshots.startup is not None
    assert "snapshots disabled" in again.snapshots.summary
