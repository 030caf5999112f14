"""The dashboard page in headless Chromium: its plots drawn from /api/report with the right data."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from pathlib import Path

import msgspec
import pytest

from events.streams import pod_stream, podvol_stream
from events.types import PodAdded, VolumeMountUncertain
from tests.analytics.feed import feed
from tests.analytics.scenario import NOW_US, E, N, node1, node2
from tests.analytics.sim import T0, SimNode, interleave
from tests.analytics.test_metrics import ANALYTICS_FAMILIES
from tests.helpers.prometheus import families, sample
from volfsm.analytics.dashboard import StoreReportSource, dashboard_server
from volfsm.analytics.report import ReportOptions
from volfsm.analytics.store import AnalyticsStore
from volfsm.web.http import HttpServer

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--virtual-time-budget=10000",
)


class Elements(HTMLParser):
    """Every element of a page with its attributes and the id of the nearest div around it."""

    VOID = frozenset({"meta", "link", "br", "img", "input", "hr"})

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, dict[str, str]]] = []
        self._stack: list[tuple[str, str]] = []
        self.text: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        box = values["id"] if tag == "div" and "id" in values else self.box
        self.found.append((tag, box, values))
        if tag not in self.VOID:
            self._stack.append((tag, box))

    def handle_endtag(self, tag: str) -> None:
        while self._stack:
            if self._stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        self.text[self.box] = self.text.get(self.box, "") + data

    @property
    def box(self) -> str:
        return self._stack[-1][1] if self._stack else ""

    def in_box(self, box: str, tag: str, cls: str) -> list[dict[str, str]]:
        return [
            a
            for t, b, a in self.found
            if b == box and t == tag and cls in a.get("class", "").split()
        ]


@pytest.fixture
async def dashboard(tmp_path: Path) -> AsyncIterator[HttpServer]:
    """The fixed history in a store, served as of T0+100 s with lag 55 s and stuck 30 s."""
    db = tmp_path / "a.db"
    with AnalyticsStore(db) as store:
        feed(store, interleave([node1(), node2()]))
    options = ReportOptions(lag_threshold_s=55.0, stuck_threshold_s=30.0)
    server = dashboard_server(StoreReportSource(db, options, clock=lambda: NOW_US))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def rendered_dom(url: str, profile: Path) -> Elements:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "chromium is not installed (apt-get install chromium)"
    proc = await asyncio.create_subprocess_exec(
        binary,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--dump-dom",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    page = Elements()
    page.feed(out.decode())
    return page


async def test_the_page_draws_every_plot_with_the_reports_data(
    dashboard: HttpServer, tmp_path: Path
) -> None:
    page = await rendered_dom(dashboard.url, tmp_path / "chromium")
    [body] = [a for t, _, a in page.found if t == "body"]
    assert body.get("data-rendered") == str(NOW_US), "the script did not render the report"
    assert "51 events" in page.text["status"] and "2 nodes" in page.text["status"]

    bars = page.in_box("latency-by-driver", "rect", "bar")
    assert [
        (b["data-driver"], b["data-operation"], b["data-p50"], b["data-p90"]) for b in bars
    ] == [
        (E, "mount_device", "1", "2"),
        (E, "volume_mount", "3", "10"),
        (E, "volume_unmount", "0.5", "0.5"),
        (E, "volume_fs_resize", "0.25", "0.25"),
        (N, "volume_mount", "1", "1"),
    ]
    widths = {b["data-operation"] + b["data-driver"]: float(b["width"]) for b in bars}
    assert widths["volume_mount" + E] > widths["mount_device" + E] > widths["volume_unmount" + E]

    points = page.in_box("latency-over-time", "circle", "point")
    assert sorted((p["data-driver"], p["data-value"], p["data-count"]) for p in points) == [
        (E, "10", "1"),
        (E, "2", "2"),
        (E, "4", "1"),
        (N, "1", "1"),
    ]
    lines = [a for t, b, a in page.found if b == "latency-over-time" and t == "g"]
    assert [g["data-driver"] for g in lines] == [E, N]

    failures = page.in_box("failure-codes", "rect", "bar")
    assert [(f["data-code"], f["data-final"], f["data-count"]) for f in failures] == [
        ("DeadlineExceeded", "false", "2"),
        ("Internal", "false", "2"),
        ("InvalidArgument", "true", "1"),
    ]
    assert "final" in failures[2]["class"].split()

    uncertain = page.in_box("uncertain-volumes", "rect", "bar")
    assert [(u["data-node"], u["data-uncertain"], u["data-stuck"]) for u in uncertain] == [
        ("n1", "1", "1"),
        ("n2", "0", "0"),
    ]

    lag = page.in_box("node-lag", "rect", "bar")
    assert [(n["data-node"], n["data-silent"], n["data-lagging"]) for n in lag] == [
        ("n1", "59", "true"),
        ("n2", "39", "false"),
    ]
    assert "lagging" in lag[0]["class"].split() and "lagging" not in lag[1]["class"].split()


async def test_http_endpoints(dashboard: HttpServer) -> None:
    async def request(method: str, path: str) -> tuple[int, bytes, bytes]:
        reader, writer = await asyncio.open_connection(dashboard.host, dashboard.port)
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        raw = await reader.read()
        writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        return int(head.split(b" ")[1]), head, body

    async def get(path: str) -> tuple[int, bytes]:
        status, _head, body = await request("GET", path)
        return status, body

    status, body = await get("/api/report")
    doc = msgspec.json.decode(body)
    assert status == 200 and doc["events"] == 51 and doc["ingest"]["applied"] == 51
    status, body = await get("/api/report?since=2023-11-14T22:13:40Z")  # T0 + 20 s
    assert status == 200 and msgspec.json.decode(body)["events"] == 21
    assert (await get("/api/report?since=yesterday-ish"))[0] == 400
    status, head, body = await request("GET", "/metrics")
    assert status == 200
    assert b"\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n" in head
    assert families(body.decode()) == ANALYTICS_FAMILIES
    assert sample(body.decode(), "volfsm_analytics_events_total", node="n1") == 26
    assert (await get("/healthz")) == (200, b"ok\n")
    assert (await get("/dashboard.js"))[0] == 200
    assert (await get("/nothing"))[0] == 404
    status, head, body = await request("HEAD", "/")
    assert status == 200 and b"Content-Type: text/html; charset=utf-8" in head and body == b""
    assert (await request("POST", "/api/report"))[0] == 405


async def test_per_node_panels_show_the_top_nodes_and_count_the_rest(tmp_path: Path) -> None:
    sims = []
    for i in range(1000):  # node i's last event is i ms after T0: node-0000 is the most silent
        sim = SimNode(f"node-{i:04d}", now_us=T0 + i * 1000)
        uid = f"pod-{i}"
        sim.emit(pod_stream(uid), PodAdded(pod_uid=uid, namespace="ns", name=uid))
        if i % 50 == 7:  # 20 nodes with a pod-volume Uncertain now
            sim.emit(
                podvol_stream(uid, "v"),
                VolumeMountUncertain(volume_id="vol", pod_uid=uid, volume_name="v", reason="x"),
            )
        sims.append(sim)
    db = tmp_path / "a"
    with AnalyticsStore(db) as store:
        feed(store, interleave([s.envs for s in sims]), batch=500)
    server = dashboard_server(StoreReportSource(db, clock=lambda: NOW_US))
    await server.start()
    try:
        page = await rendered_dom(server.url, tmp_path / "chromium")
    finally:
        await server.stop()
    assert "1000 nodes" in page.text["status"]
    lag = page.in_box("node-lag", "rect", "bar")
    assert [b["data-node"] for b in lag] == [f"node-{i:04d}" for i in range(20)]
    [rest] = page.in_box("node-lag", "text", "rest")
    assert rest["data-rest"] == "980" and "980 more nodes" in page.text["node-lag"]
    uncertain = page.in_box("uncertain-volumes", "rect", "bar")
    assert [u["data-node"] for u in uncertain] == [f"node-{i:04d}" for i in range(7, 1000, 50)]
    [rest] = page.in_box("uncertain-volumes", "text", "rest")
    assert rest["data-rest"] == "980"
