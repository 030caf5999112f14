"""Ingest partitions: the stream's transform, where the server puts each node, refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from tests.analytics.sim import STREAM, SimNode, mixed_workload, publish
from tests.analytics.test_crash import ROOT
from volfsm.analytics.partition import (
    PartitionError,
    node_partition,
    set_stream_partitions,
    stream_partitions,
)
from volfsm.bus import NatsServer

NODES = [f"node-{i}" for i in range(12)]


async def test_the_server_puts_each_node_where_node_partition_says(js: JetStreamContext) -> None:
    config = await set_stream_partitions(js, STREAM, 4)
    assert stream_partitions(config) == 4
    for node in NODES:
        sim = SimNode(node)
        mixed_workload(sim, pods=1, seed=1)
        await publish(js, sim.envs[:2])
    info = await js.stream_info(STREAM, subjects_filter="volfsm.>")
    stored = set(info.state.subjects or {})
    expected = {(node, str(node_partition(node, 4))) for node in NODES}
    assert {(s.split(".")[1], s.split(".")[3]) for s in stored} == expected
    assert len({p for _n, p in expected}) == 4  # the twelve nodes spread over all four
    assert stream_partitions(await set_stream_partitions(js, STREAM, 4)) == 4  # no change


async def test_a_stream_holding_events_is_partitioned_only_when_forced(
    js: JetStreamContext,
) -> None:
    sim = SimNode("node-a")
    mixed_workload(sim, pods=1, seed=1)
    await publish(js, sim.envs)
    with pytest.raises(PartitionError, match=f"holds {len(sim.envs)} messages"):
        await set_stream_partitions(js, STREAM, 2)
    config = await set_stream_partitions(js, STREAM, 2, force=True)
    assert stream_partitions(config) == 2


async def test_serve_refuses_a_partition_of_an_unpartitioned_stream(
    js: JetStreamContext, nats_server: NatsServer, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "volfsm.analytics", "serve", "--nats", nats_server.url]
    done = subprocess.run(
        [*command, "--db", str(tmp_path / "a"), "--partition", "1", "--partitions", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"stream {STREAM} is not partitioned" in done.stderr
