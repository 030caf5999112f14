"""`volfsm timeline`: per-volume and per-pod state segments, time in state, operations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from events.log import EventLog
from projections.timeline import OperationMark, Timeline, Timelines, build_timelines
from projections.timeline_html import render_timeline_html
from volfsm.cli.common import DataDirOpt, DbOpt, Output, OutputOpt, fail, open_log, parse_time
from volfsm.render import fmt_duration, fmt_ts, print_json, print_line, print_table, to_builtins


def _select(tls: Timelines, volume: str | None, pod: str | None) -> list[Timeline]:
    if volume is not None:
        chosen = tls.for_volume(volume)
    elif pod is not None:
        chosen = tls.for_pod(pod)
    else:
        chosen = list(tls.streams.values())
    return sorted(chosen, key=lambda tl: (tl.kind, tl.stream))


def _operation_detail(mark: OperationMark) -> str:
    if mark.status != "failed":
        return ""
    kind = "final" if mark.final else f"non-final, backoff {mark.backoff_s:g}s"
    return f"{mark.message} ({kind})"


def print_timeline_tables(tls: Timelines, chosen: list[Timeline], end_us: int) -> None:
    """Segments, time in each state, and operation marks, one table each."""
    print_line(f"{len(chosen)} timelines, open segments measured to {fmt_ts(end_us)}")
    print_line("")
    seg_rows = [
        [
            tl.stream,
            s.state,
            fmt_ts(s.from_us),
            fmt_ts(s.to_us) or "(open)",
            fmt_duration(s.duration_us(end_us)),
        ]
        for tl in chosen
        for s in tl.segments
    ]
    print_table("Segments", ["STREAM", "STATE", "FROM", "TO", "DURATION"], seg_rows)
    print_line("")
    totals = [
        [tl.stream, state, fmt_duration(us)]
        for tl in chosen
        for state, us in tl.time_in_state(end_us).items()
        if us or state == tl.state
    ]
    print_table("Time in state", ["STREAM", "STATE", "TOTAL"], totals)
    print_line("")
    op_rows = [
        [tl.stream, fmt_ts(m.ts), m.operation, m.status, m.code, _operation_detail(m), m.op_id]
        for tl in chosen
        for m in tl.marks
    ]
    print_table(
        "Operations", ["STREAM", "TIME", "OPERATION", "STATUS", "CODE", "DETAIL", "OP ID"], op_rows
    )
    pods = sorted({tl.pod_uid for tl in chosen if tl.pod_uid})
    lifecycles = [tls.pods[uid] for uid in pods if uid in tls.pods]
    if lifecycles:
        print_line("")
        print_table(
            "Pods",
            ["POD UID", "POD", "ADDED", "REMOVED"],
            [
                [p.pod_uid, f"{p.namespace}/{p.name}", fmt_ts(p.added_us), fmt_ts(p.removed_us)]
                for p in lifecycles
            ],
        )


def timeline_json(tls: Timelines, chosen: list[Timeline], end_us: int) -> dict[str, Any]:
    """Timelines as JSON: segments (µs and ISO), time in state (µs), operation marks."""
    items = []
    for tl in chosen:
        segments = []
        for s in tl.segments:
            seg = to_builtins(s)
            seg.update(
                {
                    "from": fmt_ts(s.from_us),
                    "to": fmt_ts(s.to_us) or None,
                    "duration_us": s.duration_us(end_us),
                }
            )
            segments.append(seg)
        items.append(
            {
                "stream": tl.stream,
                "kind": tl.kind,
                "volume_id": tl.volume_id,
                "pod_uid": tl.pod_uid,
                "volume_name": tl.volume_name,
                "state": tl.state,
                "segments": segments,
                "time_in_state_us": tl.time_in_state(end_us),
                "operations": to_builtins(tl.marks),
            }
        )
    pods = sorted({tl.pod_uid for tl in chosen if tl.pod_uid})
    return {
        "end_us": end_us,
        "end": fmt_ts(end_us),
        "timelines": items,
        "pods": [to_builtins(tls.pods[uid]) for uid in pods if uid in tls.pods],
    }


def load_timelines(log: EventLog, until_us: int | None) -> tuple[Timelines, int]:
    """Timelines of the log (up to `until_us`) and the time open segments run to."""
    until_seq = log.seq_at_time(until_us) if until_us is not None else None
    tls = build_timelines(log.read_after(0, until_seq=until_seq))
    return tls, until_us if until_us is not None else tls.end_us


def timeline(
    volume: Annotated[
        str | None,
        typer.Option("--volume", help="The device timeline of this volume and its pod volumes."),
    ] = None,
    pod: Annotated[
        str | None, typer.Option("--pod", help="The pod-volume timelines of this pod UID.")
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Stop at this time; open segments run to it (TIME forms)."),
    ] = None,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Write a self-contained HTML page (bars coloured by state, operations and "
            "errors marked) to this file instead of printing.",
            dir_okay=False,
        ),
    ] = None,
    output: OutputOpt = Output.table,
    data_dir: DataDirOpt = None,
    db: DbOpt = None,
) -> None:
    """Show when each device / pod volume was in which state, and its operations.

    Open segments (the current state) are measured up to the last event of the
    log, or to --until. With --html OUT the same timelines are drawn as an
    offline HTML page.
    """
    if volume is not None and pod is not None:
        raise typer.BadParameter("give --volume or --pod, not both", param_hint="--volume/--pod")
    until_us = parse_time(until, option="--until") if until is not None else None
    with open_log(data_dir, db) as log:
        tls, end_us = load_timelines(log, until_us)
        node = log.node
    chosen = _select(tls, volume, pod)
    if html is not None:
        _write_html(html, tls, chosen, end_us, node, _subject(tls, volume, pod))
        return
    if output is Output.json:
        print_json(timeline_json(tls, chosen, end_us))
    else:
        print_timeline_tables(tls, chosen, end_us)


def _subject(tls: Timelines, volume: str | None, pod: str | None) -> str | None:
    if volume is not None:
        return f"volume {volume}"
    if pod is not None:
        known = tls.pods.get(pod)
        return f"pod {known.namespace}/{known.name}" if known is not None else f"pod {pod}"
    return None


def _write_html(
    path: Path, tls: Timelines, chosen: list[Timeline], end_us: int, node: str, what: str | None
) -> None:
    title = f"volfsm timeline: {what}" if what else f"volfsm timeline: node {node or '?'}"
    page = render_timeline_html(tls, chosen, end_us, title=title, node=node)
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        fail(f"{path}: cannot write ({exc.strerror})")
    bars = sum(len(tl.segments) for tl in chosen)
    print_line(f"wrote {len(chosen)} timelines ({bars} bars) to {path}")


def register(app: typer.Typer) -> None:
    """Add `timeline` to the CLI."""
    app.command("timeline")(timeline)
