"""SIGKILL of an aggregator process in the middle of ingesting, then a restart: still exact."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from tests.analytics.sim import SimNode, interleave, mixed_workload, publish
from tests.analytics.test_aggregator import assert_exact
from volfsm.analytics.store import AnalyticsStore, StoreError
from volfsm.bus import NatsServer

ROOT = Path(__file__).resolve().parents[2]


def count_events(db: Path) -> int:
    """Events committed so far (0 before the store exists)."""
    try:
        with AnalyticsStore(db, read_only=True) as store:
            return store.event_count()
    except StoreError:
        return 0


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started by a test; every one still running is killed afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_aggregator(url: str, db: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """`python -m volfsm.analytics serve` with batches of 100, output appended to `log`."""
    command = [sys.executable, "-m", "volfsm.analytics", "serve", "--nats", url, "--db", str(db)]
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*command, "--batch", "100", *extra],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )


async def wait_for(condition: str, check: object, timeout_s: float = 60.0) -> None:
    """Poll `check()` until true; fail naming `condition` after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():  # type: ignore[operator]
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {condition}")
        await asyncio.sleep(0.02)


async def test_sigkill_mid_ingest_then_restart_is_exact(
    js: JetStreamContext,
    nats_server: NatsServer,
    tmp_path: Path,
    spawn: list[subprocess.Popen[bytes]],
) -> None:
    sims = [SimNode(f"node-{c}") for c in "abc"]
    for i, sim in enumerate(sims):
        mixed_workload(sim, pods=400, seed=i)
    nodes = [s.envs for s in sims]
    envs = interleave(nodes)
    total = len(envs)
    await publish(js, envs)
    db, log = tmp_path / "a.db", tmp_path / "aggregator.log"

    spawn.append(start_aggregator(nats_server.url, db, log))
    await wait_for("the first commits", lambda: count_events(db) >= 2000)
    spawn[-1].send_signal(signal.SIGKILL)
    spawn[-1].wait()
    at_kill = count_events(db)
    assert 2000 <= at_kill < total, f"killed at {at_kill} of {total}: not mid-ingest"

    spawn.append(start_aggregator(nats_server.url, db, log))
    await wait_for("all events", lambda: count_events(db) == total)
    spawn[-1].send_signal(signal.SIGTERM)
    assert spawn[-1].wait(timeout=30) == 0, log.read_text()
    assert_exact(db, nodes)
