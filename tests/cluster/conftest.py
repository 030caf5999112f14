"""Fixtures: a 3-server NATS JetStream cluster, volfsm nodes and aggregators; all cleaned up.

The cluster runs volfsm's roles (deploy/nats/roles/) for nodes n1, n2, n3
and ghost, plus a test user with every right that connections without
credentials log in as (the tests' own observers).

Whatever a test does, at its end every node and aggregator it started is
killed, the cluster is stopped, every mount under its tmp dir is unmounted
and the dir is removed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cluster.harness import AggregatorProcess, Node
from tests.helpers.natsroles import roles_config
from tests.service.helpers import unmount_under
from volfsm.bus.cluster import NatsCluster

CLUSTER_NODES = ("n1", "n2", "n3", "ghost")
"""The nodes the cluster has `node` role users for."""


@dataclass
class Setup:
    """What a cluster test started, for the cleanup."""

    base: Path
    cluster: NatsCluster
    nodes: list[Node] = field(default_factory=list)
    aggregators: list[AggregatorProcess] = field(default_factory=list)

    def node(self, name: str, nats_url: str, *args: str) -> Node:
        """A `volfsm serve` node (not started) with data and root dirs under `base/name`."""
        node = Node(self.base / name, name, nats_url, args)
        self.nodes.append(node)
        return node

    def aggregator(self, db: Path, *extra: str) -> AggregatorProcess:
        """An aggregator process (not started) on the whole cluster, logging beside `db`."""
        agg = AggregatorProcess(db, db.with_suffix(".log"), self.cluster.url, *extra)
        self.aggregators.append(agg)
        return agg


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    """A started 3-server cluster under tmp_path; nodes and aggregators made through it."""
    base = tmp_path / "cluster"
    cluster = NatsCluster(base / "nats", 3, extra_config=roles_config(CLUSTER_NODES, root=True))
    made = Setup(base, cluster)
    try:
        cluster.start()
        yield made
    finally:
        for agg in made.aggregators:
            agg.kill()
        for node in made.nodes:
            node.kill()
        cluster.stop()
        unmount_under(base)
        shutil.rmtree(base, ignore_errors=True)
