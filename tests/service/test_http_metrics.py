"""The tiny HTTP server, and the metrics text the service renders."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest

from events.types import (
    DesiredVolume,
    Envelope,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    VolumeMounted,
    VolumeSource,
)
from projections.asw import Asw
from volfsm.service.http import HttpServer, Response
from volfsm.service.metrics import ServiceMetrics, Snapshot

# ------------------------------------------------------------------- http


async def raw_request(port: int, data: bytes, *, half_close: bool = False) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    if half_close:
        writer.write_eof()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    return answer


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    def boom() -> Response:
        raise RuntimeError("broken route")

    srv = HttpServer(
        "127.0.0.1",
        0,
        {"/hello": lambda: Response(200, "hi\n"), "/down": lambda: Response(503, "no\n"),
         "/boom": boom},
        read_timeout_s=0.2,
    )  # fmt: skip
    await srv.start()
    yield srv
    await srv.stop()


async def test_get_head_and_errors(server: HttpServer) -> None:
    ok = await raw_request(server.port, b"GET /hello?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: 3\r\n" in ok and b"Connection: close\r\n" in ok
    assert ok.endswith(b"\r\n\r\nhi\n")
    head = await raw_request(server.port, b"HEAD /hello HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
    down = await raw_request(server.port, b"GET /down HTTP/1.0\r\n\r\n")
    assert down.startswith(b"HTTP/1.1 503 Service Unavailable")
    missing = await raw_request(server.port, b"GET /nope HTTP/1.1\r\n\r\n")
    assert missing.startswith(b"HTTP/1.1 404 Not Found") and b"/hello" in missing
    post = await raw_request(server.port, b"POST /hello HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert post.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD\r\n" in post
    bad = await raw_request(server.port, b"HELLO\r\n\r\n")
    assert bad.startswith(b"HTTP/1.1 400")
    huge = await raw_request(
        server.port, b"GET /hello HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n"
    )
    assert huge.startswith(b"HTTP/1.1 431")
    broken = await raw_request(server.port, b"GET /boom HTTP/1.1\r\n\r\n")
    assert broken.startswith(b"HTTP/1.1 500") and b"RuntimeError: broken route" in broken
    # the server is still there
    again = await raw_request(server.port, b"GET /hello HTTP/1.1\r\n\r\n")
    assert again.startswith(b"HTTP/1.1 200")


async def test_slow_and_vanishing_clients(server: HttpServer) -> None:
    assert await raw_request(server.port, b"GET /hel", half_close=True) == b""
    slow = await raw_request(server.port, b"GET /hello HTTP/1.1\r\n")
    assert slow.startswith(b"HTTP/1.1 408 Request Timeout")


# ---------------------------------------------------------------- metrics

CSI = VolumeSource(plugin="kubernetes.io/csi", driver="csi.volfsm.dev", volume_handle="h1")
EMPTY = VolumeSource(plugin="kubernetes.io/empty-dir")
CSI_ID = "kubernetes.io/csi/csi.volfsm.dev^h1"
EMPTY_ID = "kubernetes.io/empty-dir/pod-uid-1-cache"


def env(seq: int, body: object, stream: str = "device/x") -> Envelope:
    return Envelope(
        seq=seq, stream=stream, version=seq, type=type(body).__name__, schema=1, ts=seq,
        node="n1", body=body,  # type: ignore[arg-type]
    )  # fmt: skip


def fed_metrics() -> ServiceMetrics:
    m = ServiceMetrics()
    m.observe(
        [
            env(1, OperationStarted(op_id="a", operation="volume_mount", volume_id=CSI_ID,
                                    plugin="kubernetes.io/csi:csi.volfsm.dev")),
            env(2, OperationSucceeded(op_id="a", operation="volume_mount", duration_s=0.3)),
            env(3, OperationStarted(op_id="b", operation="volume_mount", volume_id=EMPTY_ID,
                                    plugin="kubernetes.io/empty-dir")),
            env(4, OperationFailed(op_id="b", operation="volume_mount", code="EACCES",
                                   message="m", final=True, duration_s=12.0)),
            env(5, VolumeMounted(pod_uid="pod-uid-1", volume_name="cache", volume_id=EMPTY_ID,
                                 mount_path="/p"), "podvol/pod-uid-1/cache"),
            env(6, OperationFailed(op_id="unknown", operation="unmount_device", code="X",
                                   message="", final=False)),
        ]
    )  # fmt: skip
    m.command("apply", "ok")
    m.command("unknown", "UnknownVerb")
    return m


def snapshot() -> Snapshot:
    pod = PodAdded(
        pod_uid="pod-uid-1", namespace="default", name="web",
        volumes=(DesiredVolume(name="data", volume_id=CSI_ID, source=CSI),
                 DesiredVolume(name="cache", volume_id=EMPTY_ID, source=EMPTY)),
    )  # fmt: skip
    asw = Asw()
    for e in fed_metrics_envs():
        asw.apply(e)
    return Snapshot(
        ready=True,
        last_seq=6,
        asw=asw,
        desired=[(pod, dv) for dv in pod.volumes],
        running_operations=1,
        relay_counters={"published": 6, "acked": 5},
    )


def fed_metrics_envs() -> list[Envelope]:
    return [
        env(5, VolumeMounted(pod_uid="pod-uid-1", volume_name="cache", volume_id=EMPTY_ID,
                             mount_path="/p"), "podvol/pod-uid-1/cache"),
    ]  # fmt: skip


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample; KeyError if absent."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, value = line.rsplit(" ", 1)
        if head.split("{", 1)[0] != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if got == labels:
            return float(value)
    raise KeyError(f"{name}{labels}")


def test_kubelet_compatible_families() -> None:
    text = fed_metrics().render(snapshot())
    assert sample(
        text, "volume_manager_total_volumes",
        plugin_name="kubernetes.io/csi:csi.volfsm.dev", state="desired_state_of_world",
    ) == 1  # fmt: skip
    assert sample(
        text, "volume_manager_total_volumes",
        plugin_name="kubernetes.io/empty-dir", state="actual_state_of_world",
    ) == 1  # fmt: skip
    labels = {"volume_plugin": "kubernetes.io/csi:csi.volfsm.dev",
              "operation_name": "volume_mount", "status": "success"}  # fmt: skip
    assert sample(text, "storage_operation_duration_seconds_bucket", **labels, le="0.25") == 0
    assert sample(text, "storage_operation_duration_seconds_bucket", **labels, le="0.5") == 1
    assert sample(text, "storage_operation_duration_seconds_bucket", **labels, le="+Inf") == 1
    assert sample(text, "storage_operation_duration_seconds_sum", **labels) == 0.3
    failed = {"volume_plugin": "kubernetes.io/empty-dir", "operation_name": "volume_mount",
              "status": "fail-unknown"}  # fmt: skip
    assert sample(text, "storage_operation_duration_seconds_bucket", **failed, le="10") == 0
    assert sample(text, "storage_operation_duration_seconds_bucket", **failed, le="15") == 1
    assert "# TYPE storage_operation_duration_seconds histogram" in text
    assert "# TYPE volume_manager_total_volumes gauge" in text


def test_volfsm_families() -> None:
    text = fed_metrics().render(snapshot())
    assert sample(text, "volfsm_ready") == 1
    assert sample(text, "volfsm_operations_running") == 1
    assert sample(text, "volfsm_publish_lag_events") == 6  # no relay: nothing acked
    assert sample(text, "volfsm_relay_published_total") == 6
    assert sample(text, "volfsm_transitions_total", fsm="podvol", event="VolumeMounted") == 1
    assert sample(
        text, "volfsm_operations_total",
        operation="volume_mount", plugin="kubernetes.io/empty-dir", result="failure",
    ) == 1  # fmt: skip
    assert sample(
        text, "volfsm_operation_errors_total",
        operation="volume_mount", plugin="kubernetes.io/empty-dir", code="EACCES", final="true",
    ) == 1  # fmt: skip
    assert (
        sample(
            text,
            "volfsm_operations_total",
            operation="unmount_device",
            plugin="N/A",
            result="failure",
        )
        == 1
    )
    assert (
        sample(text, "volfsm_pod_volumes", plugin="kubernetes.io/empty-dir", state="Mounted") == 1
    )
    assert sample(text, "volfsm_commands_total", verb="unknown", code="UnknownVerb") == 1


def test_no_ids_in_labels_and_well_formed_lines() -> None:
    text = fed_metrics().render(snapshot())
    for forbidden in ("pod-uid-1", "h1", CSI_ID, EMPTY_ID, "web", "/p"):
        assert f'"{forbidden}"' not in text and f"{forbidden}-" not in text
    line = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-z_]+="[^"]*",?)*\})? [-+0-9.eInf]+$')
    for row in text.splitlines():
        assert row.startswith("# HELP ") or row.startswith("# TYPE ") or line.match(row), row
