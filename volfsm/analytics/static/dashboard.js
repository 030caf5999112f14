// volfsm analytics dashboard: fetches /api/report and draws inline SVG plots.
// No libraries: every element is built here. Each bar or point carries its
// data as data-* attributes so tests (and curious users) can read it back.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const REFRESH_MS = 10000;
const TOP_NODES = 20; // per-node panels: the top nodes, and a count of the rest

function el(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmt(v) {
  if (v === null || v === undefined) return "";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 100) return v.toFixed(0);
  if (a >= 1) return v.toFixed(2);
  return v.toPrecision(3);
}

function isoTime(us) {
  return new Date(us / 1000).toISOString().replace(/\.\d+Z$/, "Z");
}

function clear(id) {
  const box = document.getElementById(id);
  box.textContent = "";
  return box;
}

function emptySvg(box, message) {
  const svg = el("svg", { viewBox: "0 0 620 40", "data-empty": "true" });
  svg.appendChild(el("text", { x: 8, y: 24, class: "empty" }, message));
  box.appendChild(svg);
}

// The `n` items of highest value (ties by label) and how many were left out.
function topItems(items, n) {
  const sorted = items.slice().sort((a, b) => b.value - a.value || a.label.localeCompare(b.label));
  return { shown: sorted.slice(0, n), rest: Math.max(0, sorted.length - n) };
}

// Horizontal bars: items = [{label, value, cls, data}]; an optional inner
// value (item.inner) is drawn as a lighter bar from the axis. `rest` > 0
// adds a last line counting the items not drawn.
function barChart(id, items, emptyMessage, rest = 0, restNoun = "nodes") {
  const box = clear(id);
  if (!items.length) { emptySvg(box, emptyMessage); return; }
  const rowH = 22, labelW = 250, valueW = 110, width = 620;
  const plotW = width - labelW - valueW;
  const height = (items.length + (rest ? 1 : 0)) * rowH + 8;
  const max = Math.max(...items.map((i) => i.value), 1e-9);
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  svg.appendChild(el("line", { class: "axis", x1: labelW, y1: 2, x2: labelW, y2: height - 4 }));
  items.forEach((item, i) => {
    const y = 4 + i * rowH;
    const w = Math.max(1, (item.value / max) * plotW);
    svg.appendChild(el("text", { x: labelW - 6, y: y + 14, "text-anchor": "end" }, item.label));
    const attrs = { class: ("bar " + (item.cls || "")).trim(), x: labelW, y: y + 2, width: w, height: rowH - 6,
      "data-label": item.label, "data-value": item.value };
    for (const [k, v] of Object.entries(item.data || {})) attrs["data-" + k] = v;
    const bar = el("rect", attrs);
    bar.appendChild(el("title", {}, `${item.label}: ${fmt(item.value)}`));
    svg.appendChild(bar);
    if (item.inner !== undefined && item.inner !== null) {
      const iw = Math.max(1, (item.inner / max) * plotW);
      svg.appendChild(el("rect", { class: "inner", x: labelW, y: y + 2, width: iw, height: rowH - 6 }));
    }
    svg.appendChild(el("text", { x: labelW + w + 4, y: y + 14 }, item.text || fmt(item.value)));
  });
  if (rest) {
    svg.appendChild(el("text", { class: "rest", x: labelW, y: 4 + items.length * rowH + 14,
      "data-rest": rest }, `\u2026 and ${rest} more ${restNoun}`));
  }
  box.appendChild(svg);
}

const PALETTE = ["#3f7fd9", "#d9823f", "#3fa66b", "#9b59b6", "#d94f3f", "#1abc9c", "#7f8c8d"];

// Lines over time: series = {name: [{t, value, count}]}.
function lineChart(id, series, emptyMessage) {
  const box = clear(id);
  const names = Object.keys(series).sort();
  const points = names.flatMap((n) => series[n]);
  if (!points.length) { emptySvg(box, emptyMessage); return; }
  const width = 620, height = 260, left = 48, right = 150, top = 10, bottom = 30;
  const tMin = Math.min(...points.map((p) => p.t)), tMax = Math.max(...points.map((p) => p.t));
  const vMax = Math.max(...points.map((p) => p.value), 1e-9);
  const x = (t) => left + (tMax === tMin ? 0.5 : (t - tMin) / (tMax - tMin)) * (width - left - right);
  const y = (v) => top + (1 - v / vMax) * (height - top - bottom);
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  for (const frac of [0, 0.5, 1]) {
    const v = vMax * frac;
    svg.appendChild(el("line", { class: "grid-line", x1: left, x2: width - right, y1: y(v), y2: y(v) }));
    svg.appendChild(el("text", { x: left - 4, y: y(v) + 4, "text-anchor": "end" }, fmt(v)));
  }
  svg.appendChild(el("line", { class: "axis", x1: left, x2: width - right, y1: height - bottom, y2: height - bottom }));
  svg.appendChild(el("text", { x: left, y: height - 10 }, isoTime(tMin)));
  svg.appendChild(el("text", { x: width - right, y: height - 10, "text-anchor": "end" }, isoTime(tMax)));
  names.forEach((name, i) => {
    const color = PALETTE[i % PALETTE.length];
    const g = el("g", { class: "series", "data-driver": name });
    const pts = series[name].slice().sort((a, b) => a.t - b.t);
    g.appendChild(el("polyline", { fill: "none", stroke: color, "stroke-width": 2,
      points: pts.map((p) => `${x(p.t)},${y(p.value)}`).join(" ") }));
    for (const p of pts) {
      const c = el("circle", { class: "point", cx: x(p.t), cy: y(p.value), r: 3, fill: color,
        "data-driver": name, "data-t": p.t, "data-value": p.value, "data-count": p.count });
      c.appendChild(el("title", {}, `${name} ${isoTime(p.t)}: p50 ${fmt(p.value)}s (${p.count})`));
      g.appendChild(c);
    }
    g.appendChild(el("text", { x: width - right + 6, y: top + 12 + i * 14, style: `fill: ${color}`,
      class: "legend" }, name));
    svg.appendChild(g);
  });
  box.appendChild(svg);
}

function table(id, columns, rows, emptyMessage) {
  const box = clear(id);
  if (!rows.length) { box.textContent = emptyMessage; return; }
  const t = document.createElement("table");
  const head = t.insertRow();
  for (const [name, num] of columns) {
    const th = document.createElement("th");
    th.textContent = name;
    if (num) th.className = "num";
    head.appendChild(th);
  }
  for (const row of rows) {
    const tr = t.insertRow();
    row.forEach((cell, i) => {
      const td = tr.insertCell();
      td.textContent = cell;
      if (columns[i][1]) td.className = "num";
    });
  }
  box.appendChild(t);
}

function drawLatencyOverTime(report) {
  const series = {};
  for (const p of report.latency_series) {
    (series[p.driver] = series[p.driver] || []).push({ t: p.bucket_us, value: p.p50_s, count: p.count });
  }
  lineChart("latency-over-time", series, "no publish operations yet");
}

function drawLatencyByDriver(report) {
  const items = report.latency.filter((f) => f.p90_s !== null).map((f) => ({
    label: `${f.driver} ${f.operation}`, value: f.p90_s, inner: f.p50_s,
    text: `${fmt(f.p50_s)} / ${fmt(f.p90_s)}`,
    data: { driver: f.driver, operation: f.operation, phase: f.phase, p50: f.p50_s,
      p90: f.p90_s, p99: f.p99_s, count: f.count },
  }));
  barChart("latency-by-driver", items, "no finished operations yet");
}

function drawFailureCodes(report) {
  const byCode = new Map();
  for (const f of report.failures) {
    const key = `${f.code}|${f.final}`;
    byCode.set(key, { code: f.code, final: f.final, count: (byCode.get(key)?.count || 0) + f.count });
  }
  const items = [...byCode.values()].sort((a, b) => b.count - a.count || a.code.localeCompare(b.code))
    .map((f) => ({ label: `${f.code}${f.final ? " (final)" : ""}`, value: f.count,
      text: String(f.count), cls: f.final ? "final" : "",
      data: { code: f.code, final: f.final, count: f.count } }));
  barChart("failure-codes", items, "no failures");
}

function drawUncertain(report) {
  const perNode = new Map();
  for (const n of report.nodes) perNode.set(n.node, { uncertain: 0, stuck: 0 });
  for (const u of report.uncertain_now) {
    const e = perNode.get(u.node) || { uncertain: 0, stuck: 0 };
    e.uncertain += 1;
    if (u.stuck) e.stuck += 1;
    perNode.set(u.node, e);
  }
  const items = [...perNode.entries()].map(([node, e]) => ({
    label: node, value: e.uncertain, cls: e.stuck ? "stuck" : "",
    text: e.stuck ? `${e.uncertain} (${e.stuck} stuck)` : String(e.uncertain),
    data: { node, uncertain: e.uncertain, stuck: e.stuck },
  }));
  const top = topItems(items, TOP_NODES);
  barChart("uncertain-volumes", top.shown, "no nodes yet", top.rest);
}

function drawNodeLag(report) {
  const items = report.nodes.map((n) => ({
    label: n.node, value: n.silent_s, cls: n.lagging ? "lagging" : "",
    text: `${fmt(n.silent_s)}s${n.lagging ? " lagging" : ""}`,
    data: { node: n.node, silent: n.silent_s, lagging: n.lagging, "publish-lag": n.publish_lag_s,
      events: n.events, gaps: n.gaps },
  }));
  const top = topItems(items, TOP_NODES);
  barChart("node-lag", top.shown, "no nodes yet", top.rest);
}

// The report lists the top volumes of each health section and counts them all.
function drawNearFull(report) {
  const items = report.near_full.slice(0, TOP_NODES).map((f) => {
    const share = Math.max(f.share, f.inode_share);
    return {
      label: `${f.node} ${f.namespace}/${f.claim || f.volume_id}`, value: share * 100,
      cls: share >= 1 ? "final" : "", text: `${(share * 100).toFixed(1)}%`,
      data: { node: f.node, namespace: f.namespace, claim: f.claim, volume: f.volume_id,
        share: f.share, "inode-share": f.inode_share, used: f.used_bytes,
        capacity: f.capacity_bytes },
    };
  });
  barChart("near-full", items, "no volume near full", report.near_full_total - items.length,
    "volumes");
}

function drawAbnormal(report) {
  const now = report.generated_us;
  const items = report.abnormal.slice(0, TOP_NODES).map((f) => {
    const seconds = Math.max(0, (now - f.since_us) / 1e6);
    return {
      label: `${f.node} ${f.namespace}/${f.claim || f.volume_id}`, value: seconds, cls: "stuck",
      text: `${fmt(seconds)}s ${f.message}`,
      data: { node: f.node, namespace: f.namespace, claim: f.claim, volume: f.volume_id,
        pod: f.pod_uid, message: f.message, since: f.since_us },
    };
  });
  barChart("abnormal-volumes", items, "no abnormal volume", report.abnormal_total - items.length,
    "volumes");
}

function drawOperations(report) {
  table("operations-table",
    [["driver", false], ["operation", false], ["count", true], ["failed", true],
     ["p50 s", true], ["p90 s", true], ["p99 s", true]],
    report.latency.map((f) => [f.driver, f.operation, f.count, f.failed, fmt(f.p50_s),
      fmt(f.p90_s), fmt(f.p99_s)]),
    "no finished operations yet");
}

function render(report) {
  drawLatencyOverTime(report);
  drawLatencyByDriver(report);
  drawFailureCodes(report);
  drawUncertain(report);
  drawNodeLag(report);
  drawNearFull(report);
  drawAbnormal(report);
  drawOperations(report);
  const status = document.getElementById("status");
  status.className = "";
  status.textContent = `report at ${isoTime(report.generated_us)} \u00b7 ${report.events} events \u00b7 ` +
    `${report.nodes.length} nodes \u00b7 ${report.gaps.length} open gaps`;
  document.body.setAttribute("data-rendered", String(report.generated_us));
}

async function load() {
  const status = document.getElementById("status");
  try {
    const query = new URLSearchParams(window.location.search);
    const url = "api/report" + (query.toString() ? "?" + query.toString() : "");
    const response = await fetch(url, { cache: "no-store" });
    if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
    render(await response.json());
  } catch (err) {
    status.className = "error";
    status.textContent = `could not load the report: ${err.message}`;
  } finally {
    setTimeout(load, REFRESH_MS);
  }
}

load();
