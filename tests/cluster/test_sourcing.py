"""Topology (b): node-local NATS leaf servers, a hub stream gathering them by JetStream sourcing.

Two real `volfsm serve` nodes, each on its own leaf server (JetStream
domain = node name, configured by `deploy/leaf/leaf.conf`), publish to
their node-local R1 stream. The hub (`deploy/leaf/hub.conf`) holds the
cluster-wide stream of `deploy/leaf/hub-stream.json`, which sources both
through `$JS.<node>.API`. Commands reach the nodes through the hub; the
aggregator consumes the hub stream: exactly the two logs, each event once.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import StreamConfig

from events.log import EventLog
from events.types import Envelope
from projections.analytics import report_of
from tests.analytics.feed import report_from, without_publish_lag
from tests.cluster.harness import REPO_ROOT, Commander, Node, Workload
from tests.service.helpers import unmount_under
from volfsm.analytics.aggregator import Aggregator, AggregatorConfig
from volfsm.analytics.store import AnalyticsStore
from volfsm.bus import NatsServer, free_port

DEPLOY = REPO_ROOT / "deploy" / "leaf"
HUB_LEAF_LISTEN = "0.0.0.0:7422"
STORE_DIR = "store_dir: /data\n"


def deploy_config(name: str) -> str:
    """A config of deploy/leaf/ without its store dir (NatsServer gives one under tmp_path)."""
    text = (DEPLOY / name).read_text()
    assert STORE_DIR in text
    return text.replace(STORE_DIR, "")


NODES = ("node-1", "node-2")


class Leaves:
    """The hub, one leaf server and one node per name; everything stopped at the end."""

    def __init__(self, base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.base = base
        self.leaf_port = free_port()
        hub_conf = deploy_config("hub.conf")
        assert HUB_LEAF_LISTEN in hub_conf
        self.hub = NatsServer(
            base / "hub",
            config_text=hub_conf.replace(HUB_LEAF_LISTEN, f"127.0.0.1:{self.leaf_port}"),
        )
        self.leaves: dict[str, NatsServer] = {}
        self.nodes: dict[str, Node] = {}
        self.monkeypatch = monkeypatch

    def start(self) -> None:
        """Hub, then each leaf (its domain and hub URL from its environment), then the nodes."""
        self.hub.start()
        for name in NODES:
            self.monkeypatch.setenv("NODE_NAME", name)
            self.monkeypatch.setenv("HUB_LEAF_URL", f"nats-leaf://127.0.0.1:{self.leaf_port}")
            leaf = NatsServer(self.base / f"leaf-{name}", config_text=deploy_config("leaf.conf"))
            self.leaves[name] = leaf
            leaf.start()
            self.nodes[name] = Node(self.base / name, name, leaf.url, ())
        for node in self.nodes.values():
            node.proc.start(wait_ready=False)
        for node in self.nodes.values():
            node.proc.wait_ready(90)

    def close(self) -> None:
        """Kill the nodes, stop the servers, unmount and remove everything."""
        for node in self.nodes.values():
            node.kill()
        for leaf in self.leaves.values():
            leaf.stop()
        self.hub.stop()
        unmount_under(self.base)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def leaves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Leaves]:
    made = Leaves(tmp_path / "leaves", monkeypatch)
    try:
        made.start()
        yield made
    finally:
        made.close()


def read_log(node: Node) -> list[Envelope]:
    log = EventLog(node.proc.data_dir / "volfsm.db", readonly=True)
    try:
        return list(log.read_after(0))
    finally:
        log.close()


async def test_hub_stream_sources_node_local_streams_and_the_aggregator_is_exact(
    leaves: Leaves, tmp_path: Path
) -> None:
    # Arrange: the cluster-wide stream on the hub, as deploy/leaf/hub-stream.json says
    cmd = await Commander.connect([leaves.hub.url])
    try:
        js = cmd.nc.jetstream()
        config = StreamConfig.from_response(json.loads((DEPLOY / "hub-stream.json").read_text()))
        await js.add_stream(config)

        # Act: pods on both nodes, commanded through the hub; the nodes drain and exit
        for name in leaves.nodes:
            await cmd.declare_complete(name)
        work = [Workload(cmd, node) for node in leaves.nodes.values()]
        await asyncio.gather(*(w.run("p", 4) for w in work))
        assert [await asyncio.to_thread(n.stop) for n in leaves.nodes.values()] == [0, 0]
        logs = {name: read_log(node) for name, node in leaves.nodes.items()}
        total = sum(len(e) for e in logs.values())

        # Assert: each leaf's stream holds only its own node's events; the hub all, once
        for name, leaf in leaves.leaves.items():
            local = await nats.connect(leaf.url)
            try:
                info = await local.jetstream().stream_info("VOLFSM", subjects_filter=">")
            finally:
                await local.close()
            subjects = info.state.subjects or {}
            assert all(s.startswith(f"volfsm.{name}.events.") for s in subjects)
            assert sum(subjects.values()) == len(logs[name])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while (await js.stream_info(config.name or "")).state.messages < total:
            assert loop.time() < deadline, "the hub stream did not source every event"
            await asyncio.sleep(0.1)
        assert (await js.stream_info(config.name or "")).state.messages == total

        # Act: the aggregator consumes the hub stream (named: it has no subjects of its own)
        db = tmp_path / "hub.db"
        with AnalyticsStore(db) as store:
            agg = Aggregator(store, js, AggregatorConfig(stream=config.name, batch=50))
            while store.event_count() < total:
                assert await agg.run_until_idle(idle_polls=1) or loop.time() < deadline
    finally:
        await cmd.close()

    # Assert: exactly the two logs
    with AnalyticsStore(db, read_only=True) as store:
        assert {n.node: n.events for n in store.nodes()} == {k: len(v) for k, v in logs.items()}
        assert store.gap_log() == [] and store.counters().duplicates == 0
    now = max(e.ts for envs in logs.values() for e in envs) + 1_000_000
    expected = report_of([e for envs in logs.values() for e in envs], now_us=now)
    assert without_publish_lag(report_from(db, now)) == without_publish_lag(expected)
