"""Timelines as one self-contained HTML page: a bar per device / pod-volume over time.

Pure text generation from `projections.timeline` (no I/O, nothing fetched:
CSS, SVG and a few lines of JS are inline, so the page works offline). The
SVG is written out here, not built by script, so the page reads the same
with JS off. Every element a test or a user may look for carries data-*
attributes:

* bars: `rect.seg` with `data-stream`, `data-state`, `data-from`, `data-to`
  (ISO times; `data-open="true"` on a segment still open at the end);
* operation marks: `.mark` with `data-stream`, `data-op`, `data-status`
  (started / succeeded / failed), `data-code`, `data-at`;
* backoffs after a failure: `line.backoff` with `data-from` / `data-to`;
* pod deletions: `line.pod-removed` with `data-stream`, `data-at`;
* legend: `li` items with `data-state` or `data-mark`;
* pods' waits for their claims: `table.pending` below the chart, one `tr.wait` per
  `PodPending` with `data-pod`, `data-from`, `data-to` (empty: still waiting), `data-then`.

Every bar and mark has an SVG `<title>` (the browser's tooltip); clicking
one copies its text into the details line above the chart.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from events.tables import DEVICE_FSM, PODVOL_FSM
from projections.pending import PendingSpell
from projections.textfmt import duration_text, iso_time, seconds_text
from projections.timeline import OperationMark, Segment, Timeline, Timelines

STATE_COLORS: dict[str, str] = {
    "Detached": "#9aa0a6",
    "Attached": "#6cb4e4",
    "DeviceGloballyMounted": "#1e8e3e",
    "Uncertain": "#f0a500",
    "Unmounted": "#d5d9de",
    "Mounted": "#34c759",
}
"""Bar colour of each state (Uncertain is the same colour in both machines)."""

MARK_COLORS: dict[str, str] = {
    "started": "#3c4043",
    "succeeded": "#0b5394",
    "failed": "#d93025",
}

LABEL_W = 330
PLOT_W = 1000
RIGHT_PAD = 20
AXIS_H = 34
ROW_H = 26
BAR_H = 14
GROUP_GAP = 10
MIN_BAR_W = 1.0

_TICK_STEPS_S = (
    0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
    7200, 10800, 21600, 43200, 86400, 172800, 604800,
)  # fmt: skip
_MAX_TICKS = 10


@dataclass(frozen=True, slots=True)
class _Scale:
    start_us: int
    end_us: int

    def x(self, ts_us: int) -> float:
        span = max(1, self.end_us - self.start_us)
        frac = (min(max(ts_us, self.start_us), self.end_us) - self.start_us) / span
        return round(LABEL_W + frac * PLOT_W, 2)


def legend_states() -> list[str]:
    """Every state of both machines, each once, device states first."""
    return list(dict.fromkeys(DEVICE_FSM.states + PODVOL_FSM.states))


def _attr(value: object) -> str:
    return escape(str(value), quote=True)


def _label(tl: Timeline, tls: Timelines) -> str:
    if tl.kind == "device":
        return f"device {tl.volume_id}"
    pod = tls.pods.get(tl.pod_uid)
    who = f"{pod.namespace}/{pod.name}" if pod is not None and pod.name else tl.pod_uid
    return f"{who}:{tl.volume_name}"


def order_timelines(chosen: list[Timeline], tls: Timelines) -> list[list[Timeline]]:
    """Rows grouped by volume: the device first, then its pod volumes by label."""
    groups: dict[str, list[Timeline]] = {}
    for tl in chosen:
        groups.setdefault(tl.volume_id or tl.stream, []).append(tl)
    ordered = []
    for key in sorted(groups):
        rows = sorted(groups[key], key=lambda t: (t.kind != "device", _label(t, tls), t.stream))
        ordered.append(rows)
    return ordered


def _seg_rect(tl: Timeline, seg: Segment, y: float, scale: _Scale, end_us: int) -> str:
    x0 = scale.x(seg.from_us)
    stop = seg.to_us if seg.to_us is not None else end_us
    width = max(MIN_BAR_W, round(scale.x(stop) - x0, 2))
    tip = (
        f"{tl.stream}: {seg.state} from {iso_time(seg.from_us)} to "
        f"{iso_time(stop)}{' (still)' if seg.to_us is None else ''} "
        f"({duration_text(max(0, stop - seg.from_us))})"
    )
    open_attr = ' data-open="true"' if seg.to_us is None else ""
    return (
        f'<rect class="seg" x="{x0}" y="{y}" width="{width}" height="{BAR_H}" '
        f'fill="{STATE_COLORS.get(seg.state, "#777")}" data-stream="{_attr(tl.stream)}" '
        f'data-state="{_attr(seg.state)}" data-from="{iso_time(seg.from_us)}" '
        f'data-to="{iso_time(stop)}" data-from-seq="{seg.from_seq}"{open_attr}>'
        f"<title>{escape(tip)}</title></rect>"
    )


def _mark_tip(tl: Timeline, m: OperationMark) -> str:
    text = f"{tl.stream}: {m.operation} {m.status} at {iso_time(m.ts)} (op {m.op_id})"
    if m.status == "failed":
        kind = "final" if m.final else "non-final"
        text += f"\n{m.code}: {m.message} ({kind}, backoff {seconds_text(m.backoff_s or 0.0)})"
    elif m.status == "succeeded" and m.duration_s is not None:
        text += f" in {duration_text(round(m.duration_s * 1_000_000))}"
    return text


def _mark(tl: Timeline, m: OperationMark, y: float, scale: _Scale) -> list[str]:
    x = scale.x(m.ts)
    color = MARK_COLORS.get(m.status, "#000")
    common = (
        f'data-stream="{_attr(tl.stream)}" data-op="{_attr(m.operation)}" '
        f'data-status="{_attr(m.status)}" data-code="{_attr(m.code)}" data-at="{iso_time(m.ts)}"'
    )
    title = f"<title>{escape(_mark_tip(tl, m))}</title>"
    mid = y + BAR_H / 2
    out = []
    if m.status == "failed":
        pts = f"{x},{mid - 7} {x + 6},{mid} {x},{mid + 7} {x - 6},{mid}"
        out.append(
            f'<polygon class="mark error" points="{pts}" fill="{color}" stroke="#fff" '
            f'stroke-width="1" {common}>{title}</polygon>'
        )
        if m.backoff_s:
            until = m.ts + round(m.backoff_s * 1_000_000)
            out.append(
                f'<line class="backoff" x1="{x}" y1="{y + BAR_H + 3}" x2="{scale.x(until)}" '
                f'y2="{y + BAR_H + 3}" stroke="{color}" stroke-width="2" stroke-dasharray="3 2" '
                f'data-stream="{_attr(tl.stream)}" data-from="{iso_time(m.ts)}" '
                f'data-to="{iso_time(until)}"><title>backoff after {escape(m.code)} until '
                f"{iso_time(until)}</title></line>"
            )
    elif m.status == "succeeded":
        out.append(
            f'<circle class="mark" cx="{x}" cy="{mid}" r="3.5" fill="{color}" stroke="#fff" '
            f'stroke-width="1" {common}>{title}</circle>'
        )
    else:
        out.append(
            f'<rect class="mark" x="{round(x - 1, 2)}" y="{y - 3}" width="2" '
            f'height="{BAR_H + 6}" fill="{color}" {common}>{title}</rect>'
        )
    return out


def _pod_removed(tl: Timeline, tls: Timelines, y: float, scale: _Scale) -> str:
    pod = tls.pods.get(tl.pod_uid)
    if tl.kind != "podvol" or pod is None or pod.removed_us is None:
        return ""
    x = scale.x(pod.removed_us)
    return (
        f'<line class="pod-removed" x1="{x}" y1="{y - 5}" x2="{x}" y2="{y + BAR_H + 5}" '
        f'stroke="#202124" stroke-width="2" data-stream="{_attr(tl.stream)}" '
        f'data-at="{iso_time(pod.removed_us)}"><title>pod {escape(_label(tl, tls))} removed '
        f"from the desired state at {iso_time(pod.removed_us)}</title></line>"
    )


def _ticks(scale: _Scale, height: float) -> list[str]:
    span_s = max(1e-6, (scale.end_us - scale.start_us) / 1_000_000)
    step = next((s for s in _TICK_STEPS_S if span_s / s <= _MAX_TICKS), _TICK_STEPS_S[-1])
    step_us = round(step * 1_000_000)
    first = -(-scale.start_us // step_us) * step_us
    out = []
    t = first
    while t <= scale.end_us:
        x = scale.x(t)
        text = iso_time(t)[11:23] if step < 1 else iso_time(t)[11:19]
        out.append(
            f'<line class="tick" x1="{x}" y1="{AXIS_H - 6}" x2="{x}" y2="{height}" '
            'stroke="#e8eaed" stroke-width="1"/>'
            f'<text class="tick-label" x="{x}" y="{AXIS_H - 10}" text-anchor="middle">'
            f"{text}</text>"
        )
        t += step_us
    return out


def _svg(ordered: list[list[Timeline]], tls: Timelines, scale: _Scale, end_us: int) -> str:
    rows = sum(len(g) for g in ordered)
    height = AXIS_H + rows * ROW_H + max(0, len(ordered) - 1) * GROUP_GAP + 10
    width = LABEL_W + PLOT_W + RIGHT_PAD
    body: list[str] = _ticks(scale, height - 6)
    y = float(AXIS_H)
    for index, group in enumerate(ordered):
        if index:
            y += GROUP_GAP
            body.append(
                f'<line class="group-sep" x1="0" y1="{y - GROUP_GAP / 2}" x2="{width}" '
                f'y2="{y - GROUP_GAP / 2}" stroke="#dadce0" stroke-width="1"/>'
            )
        for tl in group:
            bar_y = y + (ROW_H - BAR_H) / 2
            label = _label(tl, tls)
            shown = label if len(label) <= 42 else label[:18] + "…" + label[-23:]
            body.append(
                f'<g class="row" data-stream="{_attr(tl.stream)}" data-kind="{tl.kind}">'
                f'<text class="label {tl.kind}" x="{LABEL_W - 8}" y="{bar_y + BAR_H - 3}" '
                f'text-anchor="end"><title>{escape(tl.stream)}</title>{escape(shown)}</text>'
            )
            body.extend(_seg_rect(tl, seg, bar_y, scale, end_us) for seg in tl.segments)
            removed = _pod_removed(tl, tls, bar_y, scale)
            if removed:
                body.append(removed)
            for m in tl.marks:
                body.extend(_mark(tl, m, bar_y, scale))
            body.append("</g>")
            y += ROW_H
    return (
        f'<svg id="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="state timelines">'
        + "".join(body)
        + "</svg>"
    )


def _legend() -> str:
    items = [
        f'<li data-state="{_attr(s)}"><span class="swatch" '
        f'style="background:{STATE_COLORS[s]}"></span>{escape(s)}</li>'
        for s in legend_states()
    ]
    marks = (
        ("started", "operation started", "tick-sw", "background", MARK_COLORS["started"]),
        ("succeeded", "operation succeeded", "dot", "background", MARK_COLORS["succeeded"]),
        ("failed", "operation failed (error)", "diamond", "background", MARK_COLORS["failed"]),
        ("backoff", "backoff until retry", "dash", "border-color", MARK_COLORS["failed"]),
        ("pod-removed", "pod removed", "tick-sw", "background", "#202124"),
    )
    items += [
        f'<li data-mark="{key}"><span class="{icon}" style="{prop}:{color}"></span>'
        f"{escape(text)}</li>"
        for key, text, icon, prop, color in marks
    ]
    return '<ul class="legend">' + "".join(items) + "</ul>"


_CSS = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px;color:#202124}
h1{font-size:18px;margin:0 0 4px}
.meta{color:#5f6368;margin:0 0 8px}
.legend{list-style:none;padding:0;margin:8px 0;display:flex;flex-wrap:wrap;gap:14px}
.legend li{display:flex;align-items:center;gap:6px}
.swatch{display:inline-block;width:22px;height:12px;border-radius:2px}
.tick-sw{display:inline-block;width:3px;height:14px}
.dot{display:inline-block;width:8px;height:8px;border-radius:50%}
.diamond{display:inline-block;width:9px;height:9px;transform:rotate(45deg)}
.dash{display:inline-block;width:22px;border-top:2px dashed}
#details{min-height:1.4em;font-family:ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;
 background:#f8f9fa;border:1px solid #e8eaed;padding:4px 8px;margin:0 0 8px}
.chart-wrap{overflow-x:auto}
svg text{font:12px ui-monospace,Menlo,Consolas,monospace;fill:#202124}
svg text.tick-label{fill:#5f6368;font-size:11px}
svg text.label.device{font-weight:600}
svg .seg,svg .mark{cursor:pointer}
svg .seg:hover{stroke:#202124;stroke-width:1.5}
svg .mark:hover{stroke:#202124;stroke-width:2}
h2{font-size:15px;margin:16px 0 4px}
table.pending{border-collapse:collapse}
table.pending td,table.pending th{border:1px solid #e8eaed;padding:2px 8px;text-align:left}
"""

_JS = """
(function(){
  var details=document.getElementById('details');
  var chart=document.getElementById('chart');
  if(!details||!chart){return;}
  chart.addEventListener('click',function(ev){
    var el=ev.target;
    while(el&&el!==chart&&!(el.classList&&(el.classList.contains('seg')||el.classList.contains('mark')))){el=el.parentNode;}
    if(!el||el===chart){return;}
    var t=el.querySelector('title');
    details.textContent=t?t.textContent:'';
  });
  document.body.setAttribute('data-ready','true');
})();
"""


def _pending_table(waits: list[PendingSpell], end_us: int) -> str:
    """Pods' waits for their claims: one row per `PodPending` (nothing was mounted then)."""
    if not waits:
        return ""
    rows = []
    for spell in waits:
        for i, step in enumerate(spell.steps):
            to_us = spell.step_end_us(i)
            stop = to_us if to_us is not None else end_us
            then = spell.step_then(i)
            rows.append(
                f'<tr class="wait" data-pod="{_attr(spell.pod)}" '
                f'data-from="{iso_time(step.ts_us)}" data-to="{iso_time(to_us)}" '
                f'data-then="{_attr(then)}"><td>{escape(spell.pod)}</td>'
                f"<td>{iso_time(step.ts_us)}</td><td>{iso_time(to_us) or '(open)'}</td>"
                f"<td>{duration_text(max(0, stop - step.ts_us))}</td>"
                f"<td>{escape(step.text)}</td><td>{escape(then)}</td></tr>"
            )
    head = "".join(
        f"<th>{h}</th>" for h in ("pod", "from", "to", "duration", "waiting for", "then")
    )
    return (
        "<h2>Pending pods (waiting for their claims; nothing mounted meanwhile)</h2>"
        f'<table class="pending"><tr>{head}</tr>{"".join(rows)}</table>'
    )


def render_timeline_html(
    tls: Timelines,
    chosen: list[Timeline],
    end_us: int,
    *,
    title: str = "volfsm timeline",
    node: str = "",
    start_us: int | None = None,
    waits: list[PendingSpell] | None = None,
) -> str:
    """The whole HTML page for `chosen` timelines, open segments drawn up to `end_us`;
    `waits`, the pods' waits for their claims, as a table below the chart."""
    ordered = order_timelines(chosen, tls)
    starts = [seg.from_us for tl in chosen for seg in tl.segments[:1]]
    first = start_us if start_us is not None else min(starts, default=end_us)
    scale = _Scale(first, max(end_us, first + 1))
    bars = sum(len(tl.segments) for tl in chosen)
    marks = sum(len(tl.marks) for tl in chosen)
    errors = sum(1 for tl in chosen for m in tl.marks if m.status == "failed")
    meta = (
        f"node {escape(node or '?')} · {iso_time(first)} → {iso_time(end_us)} "
        f"({duration_text(max(0, end_us - first))}) · {len(chosen)} timelines · "
        f"{bars} state segments · {marks} operation marks ({errors} errors)"
    )
    chart = _svg(ordered, tls, scale, end_us) if chosen else "<p>(no timelines)</p>"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>"
        f'<body data-timelines="{len(chosen)}" data-segments="{bars}" data-marks="{marks}">'
        f"<h1>{escape(title)}</h1>"
        f'<p class="meta">{meta}</p>'
        f"{_legend()}"
        '<div id="details">click a bar or a mark for details</div>'
        f'<div class="chart-wrap">{chart}</div>'
        f"{_pending_table(waits or [], end_us)}"
        f"<script>{_JS}</script>"
        "</body></html>\n"
    )
