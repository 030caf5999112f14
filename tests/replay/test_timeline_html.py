"""The HTML timeline: its bars, marks and legend, as text and as Chromium renders it.

The browser tests need Debian's `chromium` (`apt-get install -y chromium`);
they fail, not skip, without it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from projections.timeline import Timelines, build_timelines
from projections.timeline_html import STATE_COLORS, legend_states, render_timeline_html
from tests.replay.conftest import run_ok
from tests.replay.incident import DATA_PV, WEB_UID, envelopes
from tests.replay.png import decode_png


class _Elements(HTMLParser):
    """Every element's tag, attributes and the text of its <title> child."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def with_class(self, name: str) -> list[dict[str, str]]:
        return [a for _, a in self.elements if name in a.get("class", "").split()]


def _parse(page: str) -> _Elements:
    parser = _Elements()
    parser.feed(page)
    return parser


def _incident_page() -> tuple[Timelines, str]:
    tls = build_timelines(envelopes())
    chosen = list(tls.streams.values())
    return tls, render_timeline_html(tls, chosen, tls.end_us, title="incident", node="node-7")


def _check_page(tls: Timelines, doc: _Elements) -> None:
    """Bars, marks, legend and labels match the timelines exactly."""
    bars = doc.with_class("seg")
    assert len(bars) == sum(len(tl.segments) for tl in tls.streams.values())
    for stream, tl in tls.streams.items():
        mine = [b for b in bars if b["data-stream"] == stream]
        assert [b["data-state"] for b in mine] == [s.state for s in tl.segments], stream
        assert all(b["fill"] == STATE_COLORS[b["data-state"]] for b in mine)
        assert [b.get("data-open") for b in mine][-1] == "true"
    marks = doc.with_class("mark")
    assert len(marks) == sum(len(tl.marks) for tl in tls.streams.values())
    errors = doc.with_class("error")
    assert {m["data-code"] for m in errors} == {
        "DeadlineExceeded",
        "Unavailable",
        "Internal",
        "FailedPrecondition",
        "InvalidArgument",
    }
    assert len(doc.with_class("backoff")) == len(errors)
    assert [a["data-at"] for a in doc.with_class("pod-removed")] == ["2024-05-01T03:11:03.000Z"] * 2
    legend = [a["data-state"] for t, a in doc.elements if t == "li" and "data-state" in a]
    assert legend == legend_states()
    marks_legend = [a["data-mark"] for t, a in doc.elements if t == "li" and "data-mark" in a]
    assert marks_legend == ["started", "succeeded", "failed", "backoff", "pod-removed"]
    text = " ".join(doc.text)
    for label in ("shop/web-0:data", "batch/report-1:input", "ci/builder-7:workspace"):
        assert label in text
    for state in legend_states():
        assert state in text


def test_the_page_draws_every_segment_mark_and_state() -> None:
    tls, page = _incident_page()
    _check_page(tls, _parse(page))


def test_the_page_is_self_contained() -> None:
    _, page = _incident_page()
    doc = _parse(page)
    assert not [t for t, _ in doc.elements if t in ("link", "img", "iframe", "object")]
    assert not [a for _, a in doc.elements if "src" in a or "href" in a]
    # The only URL is the SVG namespace name, which is never fetched.
    assert page.count("http") == page.count('xmlns="http://www.w3.org/2000/svg"') == 1
    assert "<style>" in page and "<script>" in page


def test_names_are_escaped() -> None:
    tls, _ = _incident_page()
    tls.pods[WEB_UID].name = '<script>alert("x")</script>'
    page = render_timeline_html(tls, list(tls.streams.values()), tls.end_us)
    assert '<script>alert("x")</script>' not in page
    assert "&lt;script&gt;" in page


def test_cli_writes_the_page_for_one_volume_or_one_pod(
    runner: CliRunner, incident: Path, tmp_path: Path
) -> None:
    out = tmp_path / "volume.html"
    said = run_ok(
        runner, ["timeline", "--db", str(incident), "--volume", DATA_PV, "--html", str(out)]
    )
    assert said == f"wrote 2 timelines (9 bars) to {out}\n"
    streams = {a["data-stream"] for a in _parse(out.read_text()).with_class("seg")}
    assert streams == {f"device/{DATA_PV}", f"podvol/{WEB_UID}/data"}
    out = tmp_path / "pod.html"
    run_ok(runner, ["timeline", "--db", str(incident), "--pod", WEB_UID, "--html", str(out)])
    assert "<title>volfsm timeline: pod shop/web-0</title>" in out.read_text()
    streams = {a["data-stream"] for a in _parse(out.read_text()).with_class("seg")}
    assert streams == {f"podvol/{WEB_UID}/data", f"podvol/{WEB_UID}/cache"}


def test_cli_reports_an_unwritable_page(runner: CliRunner, incident: Path, tmp_path: Path) -> None:
    from volfsm.cli import app

    target = tmp_path / "missing-dir" / "page.html"
    result = runner.invoke(app, ["timeline", "--db", str(incident), "--html", str(target)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"volfsm: error: {target}: cannot write")


# ------------------------------------------------------------------ in Chromium


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "headless Chromium is needed: apt-get install -y chromium"
    profile = tmp_path / "chromium-profile"
    return subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def page_file(runner: CliRunner, incident: Path, tmp_path: Path) -> Path:
    out = tmp_path / "timeline.html"
    run_ok(runner, ["timeline", "--db", str(incident), "--html", str(out)])
    return out


def test_chromium_renders_the_bars_labels_and_legend(page_file: Path, tmp_path: Path) -> None:
    result = _chromium(tmp_path, "--dump-dom", page_file.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    doc = _parse(result.stdout)
    _check_page(build_timelines(envelopes()), doc)
    body = next(a for t, a in doc.elements if t == "body")
    assert body["data-ready"] == "true"  # the inline script ran
    assert body["data-segments"] == str(len(doc.with_class("seg")))


def test_chromium_screenshot_shows_the_state_colours(page_file: Path, tmp_path: Path) -> None:
    shot = tmp_path / "timeline.png"
    result = _chromium(
        tmp_path, f"--screenshot={shot}", "--window-size=1400,620", page_file.as_uri()
    )
    assert result.returncode == 0, result.stderr[-2000:]
    data = shot.read_bytes()
    assert len(data) > 10_000
    image = decode_png(data)
    assert (image.width, image.height) == (1400, 620)
    colors = image.colors()
    assert len(colors) > 20
    _, count = Counter(colors).most_common(1)[0]
    assert count < image.width * image.height * 0.9  # not (almost) all one colour
    for state in ("Uncertain", "Mounted", "DeviceGloballyMounted", "Attached", "Unmounted"):
        rgb = tuple(int(STATE_COLORS[state][i : i + 2], 16) for i in (1, 3, 5))
        near = sum(
            n
            for c, n in colors.items()
            if max(abs(a - b) for a, b in zip(c, rgb, strict=True)) <= 3
        )
        assert near > 200, f"{state} {STATE_COLORS[state]}: {near} pixels"
