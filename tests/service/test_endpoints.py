"""/metrics, /healthz and /readyz of a running service, with NATS up and down.

NATS being down is publish lag, not unreadiness: the service starts, gets
ready and mounts what its log asks for while NATS is away, and the relay
catches up when NATS is back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from events.log import ANY_VERSION, EventLog
from tests.helpers.prometheus import families, sample, series
from tests.service.conftest import MakeServe
from tests.service.helpers import EXAMPLES, NODE, ServeProcess, expected_stream, read_stream
from tests.service.test_http_metrics import KUBELET_FAMILIES, SERVICE_FAMILIES, SERVICE_SERIES
from volfsm.bus import NatsServer, free_port
from volfsm.cli import app
from volfsm.desired.dsw import DesiredStateOfWorld
from volfsm.desired.loader import load_objects
from volfsm.service.config import settings_from
from volfsm.service.serve import NodeService

KUBELET_SAMPLES = {
    f"{family}{suffix}"
    for family in KUBELET_FAMILIES
    for suffix in ("", "_total", "_bucket", "_count", "_sum")
}
"""Sample names of the kubelet families added in #16."""
SCRATCH_UID = "6f1c2a4e-0000-4000-8000-00000000e001"
EMPTY_DIR = "kubernetes.io/empty-dir"


def prewrite_desired(data_dir: Path, objects: list[dict[str, Any]]) -> None:
    """Record the objects' desired-state events in a new log, as an earlier run would have."""
    data_dir.mkdir(parents=True)
    log = EventLog(data_dir / "volfsm.db", node=NODE)
    try:
        plan = DesiredStateOfWorld(lambda _source, _mode: None).plan_apply(objects)
        for change in plan.changes:
            log.append(change.stream, ANY_VERSION, [change.body])
    finally:
        log.close()


def until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def metric(svc: ServeProcess, name: str, **labels: str) -> float:
    status, text = svc.http_get("/metrics")
    assert status == 200
    try:
        return sample(text, name, **labels)
    except KeyError:
        return -1.0


def scrape(svc: ServeProcess) -> str:
    """/metrics as a scraper gets it: 200, the text format's content type, the page."""
    url = f"http://127.0.0.1:{svc.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return str(resp.read().decode())


def test_ready_and_mounting_while_nats_is_down_then_catching_up(
    runner: CliRunner, nats_server: NatsServer, make_serve: MakeServe
) -> None:
    # Arrange: the log already wants the emptyDir pod; NATS is down
    svc = make_serve(nats_url=nats_server.url)
    prewrite_desired(svc.data_dir, load_objects(EXAMPLES / "emptydir-pod.yaml"))
    nats_server.stop()

    # Act: start without NATS
    svc.start(wait_ready=False)
    until(lambda: svc.http_get("/readyz")[0] == 200, "ready")

    # Assert: alive, ready, mounting, events waiting to be published
    mounted = {"plugin_name": EMPTY_DIR, "state": "actual_state_of_world"}
    until(lambda: metric(svc, "volume_manager_total_volumes", **mounted) == 2, "two mounts")
    status, body = svc.http_get("/readyz")
    assert status == 200
    assert "[+] asw rebuilt" in body and "[+] first reconcile done" in body
    assert "nats disconnected" in body
    assert svc.http_get("/healthz") == (200, "ok\n")
    assert metric(svc, "volfsm_publish_lag_events") > 0
    assert metric(svc, "volfsm_relay_connected") == 0
    assert metric(svc, "volfsm_ready") == 1

    # Act: NATS comes back
    nats_server.start()

    # Assert: caught up, commands taken, stream equals log
    until(lambda: metric(svc, "volfsm_publish_lag_events") == 0, "relay caught up")
    until(lambda: metric(svc, "volfsm_commands_connected") == 1, "intake connected")
    result = runner.invoke(app, ["get", "pods", "--data-dir", str(svc.data_dir)])
    assert result.exit_code == 0, result.output
    assert "Mounted" in result.stdout
    text = scrape(svc)
    assert families(text) == SERVICE_FAMILIES | KUBELET_FAMILIES
    assert {name for name, _ in series(text) - SERVICE_SERIES} <= KUBELET_SAMPLES
    ok_mount = {"volume_plugin": EMPTY_DIR, "operation_name": "volume_mount", "status": "success",
                "migrated": "false"}  # fmt: skip
    assert sample(text, "storage_operation_duration_seconds_count", **ok_mount) == 2
    assert sample(text, "volfsm_transitions_total", fsm="podvol", event="VolumeMounted") == 2
    assert sample(text, "volfsm_commands_total", verb="get", code="ok") == 1
    assert SCRATCH_UID not in text and "scratch" not in text
    assert svc.http_get("/nope")[0] == 404
    assert svc.stop() == 0
    log = svc.open_log()
    try:
        want = expected_stream(log)
    finally:
        log.close()
    assert read_stream(nats_server.url) == want


def test_not_ready_before_start(tmp_path: Path) -> None:
    service = NodeService(settings_from({"data_dir": str(tmp_path), "node": NODE}, environ={}))
    resp = service.readyz()
    assert resp.status == 503
    assert resp.body.startswith("not ready\n")
    assert "[-] asw rebuilt" in resp.body and "[-] first reconcile done" in resp.body
    assert service.healthz().status == 200


async def http_get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of one GET to 127.0.0.1:`port`, from a thread."""

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    return await asyncio.to_thread(get)


async def test_healthz_is_503_once_the_reconciler_died(
    tmp_path: Path, nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrange: a service in this process, ready and healthy
    port = free_port()
    settings = settings_from(
        {
            "data_dir": str(tmp_path / "data"),
            "node": NODE,
            "nats": nats_server.url,
            "http": f"127.0.0.1:{port}",
        },
        environ={},
    )
    service = NodeService(settings)
    await service.start()
    try:
        async with asyncio.timeout(60):
            while not service.ready:
                await asyncio.sleep(0.02)
        assert await http_get(port, "/healthz") == (200, "ok\n")
        engine = service.engine
        assert engine is not None and engine.alive

        # Act: the reconciler loop dies of a bug on its next pass
        def broken(limit: int | None = None) -> None:
            raise RuntimeError("a bug in the reconciler")

        monkeypatch.setattr(engine.reconciler, "reconcile", broken)
        engine.reconciler.wake()
        async with asyncio.timeout(60):
            while engine.alive:
                await asyncio.sleep(0.02)

        # Assert: not alive any more, though still running and "ready"
        assert engine.running and service.ready
        status, body = await http_get(port, "/healthz")
        assert status == 503
        assert "reconciler died" in body
    finally:
        await service.stop()
    assert service.healthz().status == 503


def nats_children(pid: int) -> list[int]:
    """Child processes of `pid` that run nats-server."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"nats-server" in cmdline:
                out.append(int(child))
    return out


def test_the_embedded_server_is_restarted_if_it_dies(
    runner: CliRunner, make_serve: MakeServe
) -> None:
    svc = make_serve().start()
    assert svc.proc is not None
    pid = svc.proc.pid
    [first] = nats_children(pid)

    os.kill(first, signal.SIGKILL)
    until(lambda: nats_children(pid) not in ([], [first]), "a new nats-server")
    until(lambda: metric(svc, "volfsm_relay_connected") == 1, "relay reconnected")
    until(lambda: metric(svc, "volfsm_commands_connected") == 1, "intake reconnected")

    where = ["--data-dir", str(svc.data_dir)]
    result = runner.invoke(app, ["apply", "-f", str(EXAMPLES / "emptydir-pod.yaml"), *where])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["wait", "pod", "scratch", "--for", "mounted", *where])
    assert result.exit_code == 0, result.output
    until(lambda: metric(svc, "volfsm_publish_lag_events") == 0, "relay caught up")
    log = svc.open_log()
    try:
        want = expected_stream(log)
    finally:
        log.close()
    assert read_stream(svc.url) == want
    assert svc.stop() == 0
