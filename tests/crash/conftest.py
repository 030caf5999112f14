"""Fixtures: one nats-server and one CSI driver for the whole crash suite; a node per test.

The nats-server and the driver outlive every `volfsm serve` crash (that is
the point); nodes have their own names, data and root dirs and driver
volumes, so sharing both is safe. Whatever a test does, its node's service
is killed and everything under its root dir unmounted and detached.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.crash.harness import CrashNode, cleanup_node
from tests.helpers.csidriver import DriverProcess, cleanup_under, leftovers_under
from volfsm.bus import NatsServer

MakeNode = Callable[..., CrashNode]

_names = itertools.count(1)


@pytest.fixture(scope="package")
def crash_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's own directory (driver state, nats store); package-scoped so all is
    stopped before other suites' end-of-session leftover checks run."""
    return tmp_path_factory.mktemp("crash")


@pytest.fixture(scope="package")
def crash_nats(crash_dir: Path) -> Iterator[NatsServer]:
    """A JetStream server shared by every node of the suite."""
    server = NatsServer(crash_dir / "nats").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def crash_driver(crash_dir: Path) -> Iterator[DriverProcess]:
    """volfsm's CSI driver, shared; stopped and everything it left cleaned up at the end."""
    drv = DriverProcess(crash_dir / "driver", node_id="crash-node")
    drv.workdir.mkdir()
    try:
        yield drv.start()
    finally:
        drv.close()
        cleanup_under(crash_dir)
        left = leftovers_under(crash_dir)
        assert left.empty, f"left by the crash suite: {left}"


@pytest.fixture
def make_node(
    tmp_path: Path, crash_nats: NatsServer, crash_driver: DriverProcess
) -> Iterator[MakeNode]:
    """Build crash-test nodes under tmp_path (not started); all cleaned up after the test."""
    made: list[CrashNode] = []

    def make(**kwargs: object) -> CrashNode:
        n = next(_names)
        node = CrashNode(
            tmp_path / f"node{n}",
            crash_nats.url,
            crash_driver,
            f"crash{n}",
            **kwargs,  # type: ignore[arg-type]
        )
        made.append(node)
        return node

    try:
        yield make
    finally:
        crash_driver.clear_faults()
        for node in made:
            cleanup_node(node)
