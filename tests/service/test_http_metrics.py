"""The web layer's HTTP server, and the service's metrics as a scraper parses them."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from events.types import (
    DesiredVolume,
    DeviceAttached,
    Envelope,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    VolumeMounted,
    VolumeSource,
)
from projections.asw import Asw
from tests.helpers.prometheus import Series, families, label_values, sample, samples, series
from volfsm.engine.volstats import VolumeStats, VolumeUsage
from volfsm.service.metrics import ServiceMetrics, Snapshot
from volfsm.web.exposition import exposition
from volfsm.web.http import HttpServer, Request, Response

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
    def boom(_request: Request) -> Response:
        raise RuntimeError("broken route")

    async def echo(request: Request) -> Response:
        await asyncio.sleep(0)
        return Response(200, f"{request.method} {request.param('say')}".encode(), "text/x-echo")

    srv = HttpServer(
        "127.0.0.1",
        0,
        {"/hello": lambda _r: Response(200, "hi\n"), "/down": lambda _r: Response(503, "no\n"),
         "/boom": boom, "/echo": echo},
        read_timeout_s=0.2,
    )  # fmt: skip
    await srv.start()
    yield srv
    await srv.stop()


async def test_get_head_and_errors(server: HttpServer) -> None:
    ok = await raw_request(server.port, b"GET /hello?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: 3\r\n" in ok and b"Connection: close\r\n" in ok
    assert b"Content-Type: text/plain; charset=utf-8\r\n" in ok
    assert ok.endswith(b"\r\n\r\nhi\n")
    head = await raw_request(server.port, b"HEAD /hello HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
    assert b"Content-Length: 3\r\n" in head
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


async def test_async_routes_get_the_query_and_may_answer_bytes(server: HttpServer) -> None:
    echo = await raw_request(server.port, b"GET /echo?say=a%20b&say=c HTTP/1.1\r\n\r\n")
    assert echo.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Type: text/x-echo\r\n" in echo
    assert echo.endswith(b"\r\n\r\nGET a b")
    head = await raw_request(server.port, b"HEAD /echo HTTP/1.1\r\n\r\n")
    assert b"Content-Length: 5\r\n" in head and head.endswith(b"\r\n\r\n")


async def test_slow_and_vanishing_clients(server: HttpServer) -> None:
    assert await raw_request(server.port, b"GET /hel", half_close=True) == b""
    slow = await raw_request(server.port, b"GET /hello HTTP/1.1\r\n")
    assert slow.startswith(b"HTTP/1.1 408 Request Timeout")


# ---------------------------------------------------------------- metrics

RELAY_COUNTERS = ("published", "acked", "duplicates", "timeouts", "errors", "reconnects",
                  "skipped", "rewinds")  # fmt: skip
SERVICE_FAMILIES = {
    "volfsm_ready": "gauge",
    "volfsm_log_last_seq": "gauge",
    "volfsm_operations_running": "gauge",
    "volume_manager_total_volumes": "gauge",
    "volfsm_devices": "gauge",
    "volfsm_pod_volumes": "gauge",
    "volfsm_publish_lag_events": "gauge",
    "volfsm_relay_connected": "gauge",
    "volfsm_relay_acked_seq": "gauge",
    "volfsm_commands_connected": "gauge",
    **{f"volfsm_relay_{key}": "counter" for key in RELAY_COUNTERS},
    "volfsm_transitions": "counter",
    "volfsm_desired_events": "counter",
    "volfsm_operations_started": "counter",
    "volfsm_operations": "counter",
    "volfsm_operation_errors": "counter",
    "storage_operation_duration_seconds": "histogram",
    "volfsm_commands": "counter",
    "volfsm_volume_content_writes": "counter",  # object volumes' (re)writes, issue #14
    "volfsm_emptydir_size_limit_bytes": "gauge",  # on-disk emptyDir sizeLimit, issue #15
    "volfsm_emptydir_used_bytes": "gauge",
    "volfsm_emptydir_size_limit_exceeded": "gauge",
}
"""Every family /metrics of `volfsm serve` exposed before prometheus_client (parser names:
a counter's family has no `_total`, its samples do)."""
KUBELET_FAMILIES = {
    **{f"kubelet_volume_stats_{n}": "gauge" for n in ("capacity_bytes", "available_bytes",
       "used_bytes", "inodes", "inodes_free", "inodes_used", "health_status_abnormal")},
    "kubelet_volume_metric_collection_duration_seconds": "histogram",
    "csi_operations_seconds": "histogram",
    "volume_operation_total_seconds": "histogram",
    "reconstruct_volume_operations": "counter",
    "reconstruct_volume_operations_errors": "counter",
    "force_cleaned_failed_volume_operations": "counter",
    "force_cleaned_failed_volume_operation_errors": "counter",
}  # fmt: skip
"""The kubelet's volume families added for the operator's view (#16)."""

_STORAGE = ("migrated", "operation_name", "status", "volume_plugin")
SERVICE_SERIES: set[Series] = {
    ("storage_operation_duration_seconds_bucket", ("le", *_STORAGE)),
    ("storage_operation_duration_seconds_count", _STORAGE),
    ("storage_operation_duration_seconds_sum", _STORAGE),
    ("volume_manager_total_volumes", ("plugin_name", "state")),
    ("volfsm_commands_connected", ()),
    ("volfsm_commands_total", ("code", "verb")),
    ("volfsm_devices", ("plugin", "state")),
    ("volfsm_log_last_seq", ()),
    ("volfsm_operation_errors_total", ("code", "final", "operation", "plugin")),
    ("volfsm_operations_running", ()),
    ("volfsm_operations_started_total", ("operation", "plugin")),
    ("volfsm_operations_total", ("operation", "plugin", "result")),
    ("volfsm_pod_volumes", ("plugin", "state")),
    ("volfsm_publish_lag_events", ()),
    ("volfsm_ready", ()),
    ("volfsm_relay_acked_seq", ()),
    ("volfsm_relay_connected", ()),
    *((f"volfsm_relay_{key}_total", ()) for key in RELAY_COUNTERS),
    ("volfsm_transitions_total", ("event", "fsm")),
    ("volfsm_desired_events_total", ("event",)),
}
"""Every (sample name, label names) /metrics of `volfsm serve` exposed before prometheus_client."""

CSI = VolumeSource(plugin="kubernetes.io/csi", driver="csi.volfsm.dev", volume_handle="h1")
EMPTY = VolumeSource(plugin="kubernetes.io/empty-dir")
CSI_ID = "kubernetes.io/csi/csi.volfsm.dev^h1"
EMPTY_ID = "kubernetes.io/empty-dir/pod-uid-1-cache"


def env(seq: int, body: object, stream: str = "device/x") -> Envelope:
    return Envelope(
        seq=seq, stream=stream, version=seq, type=type(body).__name__, schema=1, ts=seq,
        node="n1", body=body,  # type: ignore[arg-type]
    )  # fmt: skip


def fed_metrics(snap: Snapshot) -> ServiceMetrics:
    m = ServiceMetrics(lambda: snap)
    m.observe(
        [
            env(1, OperationStarted(op_id="a", operation="volume_mount", volume_id=CSI_ID,
                                    plugin="kubernetes.io/csi:csi.volfsm.dev")),
            env(2, OperationSucceeded(op_id="a", operation="volume_mount", duration_s=0.3)),
            env(3, OperationStarted(op_id="b", operation="volume_mount", volume_id=EMPTY_ID,
                                    plugin="kubernetes.io/empty-dir")),
            env(4, OperationFailed(op_id="b", operation="volume_mount", code="EACCES",
                                   message="m", final=True, duration_s=12.0)),
            *asw_envs(),
            env(7, OperationFailed(op_id="unknown", operation="unmount_device", code="X",
                                   message="", final=False)),
            env(8, PodAdded(pod_uid="pod-uid-2", namespace="default", name="db", volumes=()),
                "desired/pod-uid-2"),
        ]
    )  # fmt: skip
    m.command("apply", "ok")
    m.command("unknown", "UnknownVerb")
    return m


def asw_envs() -> list[Envelope]:
    return [
        env(5, VolumeMounted(pod_uid="pod-uid-1", volume_name="cache", volume_id=EMPTY_ID,
                             mount_path="/p"), "podvol/pod-uid-1/cache"),
        env(6, DeviceAttached(volume_id=CSI_ID, plugin="kubernetes.io/csi"), f"device/{CSI_ID}"),
    ]  # fmt: skip


def snapshot() -> Snapshot:
    pod = PodAdded(
        pod_uid="pod-uid-1", namespace="default", name="web",
        volumes=(DesiredVolume(name="data", volume_id=CSI_ID, source=CSI),
                 DesiredVolume(name="cache", volume_id=EMPTY_ID, source=EMPTY)),
    )  # fmt: skip
    asw = Asw()
    for e in asw_envs():
        asw.apply(e)
    return Snapshot(
        ready=True,
        last_seq=8,
        asw=asw,
        desired=[(pod, dv) for dv in pod.volumes],
        running_operations=1,
        relay_counters={"published": 6, "acked": 5},
    )


def scraped() -> str:
    return exposition(fed_metrics(snapshot()).registry).decode()


def test_every_family_and_series_exposed_before_is_there() -> None:
    text = scraped()
    assert families(text) == SERVICE_FAMILIES | KUBELET_FAMILIES
    assert series(text) >= SERVICE_SERIES


def test_volume_stats_csi_calls_and_reconstruction_counters() -> None:
    snap = snapshot()
    usage = VolumeUsage(capacity_bytes=100, available_bytes=60, used_bytes=40, inodes=10,
                        inodes_free=7, inodes_used=3, source="csi")  # fmt: skip
    stats = VolumeStats(pod_uid="pod-uid-1", volume_name="data", volume_id=CSI_ID,
                        namespace="default", pod_name="web", claim="data-web-0",
                        metric_source="csi.volfsm.dev", usage=usage, abnormal=True,
                        message="m", gathered_us=1)  # fmt: skip
    snap.volume_stats = [stats]
    snap.reconstruction = {"reconstructed": 2, "orphans": [{"status": "cleaned"},
                           {"status": "failed"}, {"status": "pending"}], "error": ""}  # fmt: skip
    m = fed_metrics(snap)
    m.csi_call("csi.volfsm.dev", "/csi.v1.Node/NodeStageVolume", "DeadlineExceeded", 3.0)
    m.volume_stats_collected("csi.volfsm.dev", 0.02)
    text = exposition(m.registry).decode()
    claim = {"namespace": "default", "persistentvolumeclaim": "data-web-0"}
    assert sample(text, "kubelet_volume_stats_capacity_bytes", **claim) == 100
    assert sample(text, "kubelet_volume_stats_inodes_used", **claim) == 3
    assert sample(text, "kubelet_volume_stats_health_status_abnormal", **claim) == 1
    call = {"driver_name": "csi.volfsm.dev", "method_name": "/csi.v1.Node/NodeStageVolume",
            "grpc_status_code": "DeadlineExceeded", "migrated": "false"}  # fmt: skip
    assert sample(text, "csi_operations_seconds_bucket", **call, le="2.5") == 0
    assert sample(text, "csi_operations_seconds_bucket", **call, le="5") == 1
    assert (
        sample(text, "kubelet_volume_metric_collection_duration_seconds_count",
               metric_source="csi.volfsm.dev") == 1
    )  # fmt: skip
    e2e = {"plugin_name": "kubernetes.io/csi:csi.volfsm.dev", "operation_name": "volume_mount"}
    assert sample(text, "volume_operation_total_seconds_count", **e2e) == 1
    assert sample(text, "reconstruct_volume_operations_total") == 5
    assert sample(text, "reconstruct_volume_operations_errors_total") == 3
    assert sample(text, "force_cleaned_failed_volume_operations_total") == 2
    assert sample(text, "force_cleaned_failed_volume_operation_errors_total") == 1


def test_emptydir_size_limit_gauges() -> None:
    snap = snapshot()
    usage = VolumeUsage(capacity_bytes=10**9, used_bytes=3 << 20, inodes_used=4, source="du")
    common = {"volume_id": EMPTY_ID, "namespace": "default", "claim": "", "metric_source": "du",
              "message": "", "gathered_us": 1, "size_limit_bytes": 1 << 20}  # fmt: skip
    over = VolumeStats(pod_uid="u1", volume_name="scratch", pod_name="web", usage=usage,
                       abnormal=True, **common)  # fmt: skip
    unknown = VolumeStats(pod_uid="u2", volume_name="scratch", pod_name="db", usage=None,
                          abnormal=None, **common)  # fmt: skip
    snap.empty_dir_stats = [over, unknown]
    text = exposition(fed_metrics(snap).registry).decode()
    web = {"namespace": "default", "pod": "web", "volume": "scratch"}
    db = {"namespace": "default", "pod": "db", "volume": "scratch"}
    assert sample(text, "volfsm_emptydir_size_limit_exceeded", **web) == 1
    assert sample(text, "volfsm_emptydir_used_bytes", **web) == 3 << 20
    assert sample(text, "volfsm_emptydir_size_limit_bytes", **db) == 1 << 20
    found = samples(text)  # a walk that could not finish: neither usage nor verdict
    for name in ("volfsm_emptydir_size_limit_exceeded", "volfsm_emptydir_used_bytes"):
        assert (name, frozenset(db.items())) not in found


def test_end_to_end_spans_failed_attempts_until_one_succeeds() -> None:
    m = ServiceMetrics(snapshot)
    stream = "podvol/pod-uid-1/cache"
    m.observe(
        [
            env(1_000_000, OperationStarted(op_id="a", operation="volume_mount",
                volume_id=EMPTY_ID, plugin="kubernetes.io/empty-dir"), stream),
            env(2_000_000, OperationFailed(op_id="a", operation="volume_mount", code="X",
                message="", final=False), stream),
            env(5_000_000, OperationStarted(op_id="b", operation="volume_mount",
                volume_id=EMPTY_ID, plugin="kubernetes.io/empty-dir"), stream),
            env(7_500_000, OperationSucceeded(op_id="b", operation="volume_mount"), stream),
        ]
    )  # fmt: skip
    text = exposition(m.registry).decode()
    e2e = {"plugin_name": "kubernetes.io/empty-dir", "operation_name": "volume_mount"}
    assert sample(text, "volume_operation_total_seconds_count", **e2e) == 1
    assert sample(text, "volume_operation_total_seconds_sum", **e2e) == 6.5


def test_kubelet_compatible_families() -> None:
    text = scraped()
    assert sample(
        text, "volume_manager_total_volumes",
        plugin_name="kubernetes.io/csi:csi.volfsm.dev", state="desired_state_of_world",
    ) == 1  # fmt: skip
    assert sample(
        text, "volume_manager_total_volumes",
        plugin_name="kubernetes.io/empty-dir", state="actual_state_of_world",
    ) == 1  # fmt: skip
    labels = {"volume_plugin": "kubernetes.io/csi:csi.volfsm.dev", "migrated": "false",
              "operation_name": "volume_mount", "status": "success"}  # fmt: skip
    assert sample(text, "storage_operation_duration_seconds_bucket", **labels, le="0.25") == 0
    assert sample(text, "storage_operation_duration_seconds_bucket", **labels, le="0.5") == 1
    assert sample(text, "storage_operation_duration_seconds_bucket", **labels, le="+Inf") == 1
    assert sample(text, "storage_operation_duration_seconds_sum", **labels) == 0.3
    assert sample(text, "storage_operation_duration_seconds_count", **labels) == 1
    failed = {"volume_plugin": "kubernetes.io/empty-dir", "operation_name": "volume_mount",
              "status": "fail-unknown", "migrated": "false"}  # fmt: skip
    assert sample(text, "storage_operation_duration_seconds_bucket", **failed, le="10") == 0
    assert sample(text, "storage_operation_duration_seconds_bucket", **failed, le="15") == 1
    assert "# TYPE storage_operation_duration_seconds histogram\n" in text
    assert "# TYPE volume_manager_total_volumes gauge\n" in text


def test_histogram_bounds_are_the_kubelets() -> None:
    bounds = [
        dict(labels)["le"]
        for name, labels in _sample_keys(scraped())
        if name == "storage_operation_duration_seconds_bucket"
        and dict(labels)["status"] == "success"
    ]
    assert bounds == ["0.1", "0.25", "0.5", "1", "2.5", "5", "10", "15", "25", "50", "120", "300",
                      "600", "+Inf"]  # fmt: skip


def _sample_keys(text: str) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    return [
        (s.name, tuple(s.labels.items()))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def test_volfsm_families() -> None:
    text = scraped()
    assert sample(text, "volfsm_ready") == 1
    assert sample(text, "volfsm_log_last_seq") == 8
    assert sample(text, "volfsm_operations_running") == 1
    assert sample(text, "volfsm_publish_lag_events") == 8  # no relay: nothing acked
    assert sample(text, "volfsm_relay_published_total") == 6
    assert sample(text, "volfsm_relay_rewinds_total") == 0
    assert sample(text, "volfsm_transitions_total", fsm="podvol", event="VolumeMounted") == 1
    assert sample(text, "volfsm_transitions_total", fsm="device", event="DeviceAttached") == 1
    assert sample(text, "volfsm_desired_events_total", event="PodAdded") == 1
    assert sample(
        text, "volfsm_operations_started_total",
        operation="volume_mount", plugin="kubernetes.io/csi:csi.volfsm.dev",
    ) == 1  # fmt: skip
    assert sample(
        text, "volfsm_operations_total",
        operation="volume_mount", plugin="kubernetes.io/empty-dir", result="failure",
    ) == 1  # fmt: skip
    assert sample(
        text, "volfsm_operation_errors_total",
        operation="volume_mount", plugin="kubernetes.io/empty-dir", code="EACCES", final="true",
    ) == 1  # fmt: skip
    assert sample(
        text, "volfsm_operations_total",
        operation="unmount_device", plugin="N/A", result="failure",
    ) == 1  # fmt: skip
    assert (
        sample(text, "volfsm_pod_volumes", plugin="kubernetes.io/empty-dir", state="Mounted") == 1
    )
    assert (
        sample(text, "volfsm_devices", plugin="kubernetes.io/csi:csi.volfsm.dev", state="Attached")
        == 1
    )
    assert sample(text, "volfsm_commands_total", verb="unknown", code="UnknownVerb") == 1


def test_no_ids_in_labels() -> None:
    values = label_values(scraped())
    for forbidden in ("pod-uid-1", "pod-uid-2", "h1", CSI_ID, EMPTY_ID, "web", "db", "/p"):
        assert not any(forbidden == v or f"{forbidden}-" in v for v in values), forbidden


def test_infinite_values_render() -> None:
    snap = snapshot()
    m = ServiceMetrics(lambda: snap)
    m.observe(
        [
            env(1, OperationStarted(op_id="a", operation="volume_mount", volume_id=EMPTY_ID,
                                    plugin="kubernetes.io/empty-dir")),
            env(2, OperationSucceeded(op_id="a", operation="volume_mount", duration_s=math.inf)),
        ]
    )  # fmt: skip
    text = exposition(m.registry).decode()
    labels = {"volume_plugin": "kubernetes.io/empty-dir", "operation_name": "volume_mount",
              "status": "success", "migrated": "false"}  # fmt: skip
    assert sample(text, "storage_operation_duration_seconds_sum", **labels) == math.inf
    assert sample(text, "storage_operation_duration_seconds_bucket", **labels, le="600") == 0
    assert sample(text, "storage_operation_duration_seconds_bucket", **labels, le="+Inf") == 1
