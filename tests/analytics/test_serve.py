"""`volfsm analytics serve --http`: a real process consuming, serving the report and metrics."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from tests.analytics.sim import SimNode, interleave, mixed_workload, publish
from tests.analytics.test_crash import start_aggregator, wait_for
from tests.analytics.test_metrics import ANALYTICS_FAMILIES, ANALYTICS_SERIES
from tests.helpers.prometheus import families, sample, series
from volfsm.bus import NatsServer, free_port


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), bytes(resp.read())
    except OSError:
        return 0, b""


async def test_serve_consumes_and_serves_report_and_metrics(
    js: JetStreamContext,
    nats_server: NatsServer,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    sims = [SimNode(f"node-{c}") for c in "ab"]
    for i, sim in enumerate(sims):
        mixed_workload(sim, pods=30, seed=i)
    envs = interleave([s.envs for s in sims])
    port = free_port()
    log = tmp_path / "serve.log"
    procs.append(
        start_aggregator(nats_server.url, tmp_path / "a.db", log, "--http", f"127.0.0.1:{port}")
    )
    base = f"http://127.0.0.1:{port}"
    await wait_for("the dashboard", lambda: fetch(base + "/healthz")[0] == 200)
    await publish(js, envs)

    def report_events() -> int:
        status, body = fetch(base + "/api/report")
        return json.loads(body)["events"] if status == 200 else -1

    await wait_for("every event in the report", lambda: report_events() == len(envs))
    status, page = await asyncio.to_thread(fetch, base + "/")
    assert status == 200 and b'<script src="dashboard.js">' in page
    status, metrics = await asyncio.to_thread(fetch, base + "/metrics")
    assert status == 200
    counts = {s.name: len(s.envs) for s in sims}
    for node, n in counts.items():
        assert sample(metrics.decode(), "volfsm_analytics_events_total", node=node) == n
    assert families(metrics.decode()) == ANALYTICS_FAMILIES
    assert series(metrics.decode()) <= ANALYTICS_SERIES
    procs[-1].send_signal(signal.SIGTERM)
    assert procs[-1].wait(timeout=30) == 0, log.read_text()
    assert "dashboard on http://127.0.0.1" in log.read_text()
