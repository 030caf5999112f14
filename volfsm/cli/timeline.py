"""`volfsm timeline`: per-volume and per-pod state segments, time in state, operations."""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from projections.pending import PendingSpell, pending_json
from projections.textfmt import TIME_HELP
from projections.timeline import OperationMark, Segment, Timeline, Timelines, build_timelines
from projections.timeline_html import render_timeline_html
from volfsm.cli.common import DataDirOpt, DbOpt, fail, open_log, parse_time, to_file
from volfsm.cli.refs import UnknownNameError, check_volume, resolve_pods

if TYPE_CHECKING:
    from events.log import EventLog
from volfsm.render import fmt_duration, fmt_ts, print_json, print_line, print_table, to_builtins


def _select(tls: Timelines, volume: str | None, uids: list[str]) -> list[Timeline]:
    if volume is not None:
        chosen = tls.for_volume(volume)
    elif uids:
        chosen = [tl for uid in uids for tl in tls.for_pod(uid)]
    else:
        chosen = list(tls.streams.values())
    return sorted(chosen, key=lambda tl: (tl.kind, tl.stream))


def _operation_detail(mark: OperationMark) -> str:
    if mark.status != "failed":
        return ""
    kind = "final" if mark.final else f"non-final, backoff {mark.backoff_s:g}s"
    return f"{mark.message} ({kind})"


def _pending_rows(waits: list[PendingSpell], end_us: int) -> list[list[str]]:
    """One row per `PodPending`: what the pod waited for, from when to when, what followed."""
    rows = []
    for spell in waits:
        for i, step in enumerate(spell.steps):
            to_us = spell.step_end_us(i)
            stop = to_us if to_us is not None else end_us
            rows.append(
                [
                    spell.pod,
                    fmt_ts(step.ts_us),
                    fmt_ts(to_us) or "(open)",
                    fmt_duration(max(0, stop - step.ts_us)),
                    step.text,
                    spell.step_then(i),
                ]
            )
    return rows


def print_timeline_tables(
    tls: Timelines, chosen: list[Timeline], end_us: int, waits: list[PendingSpell] | None = None
) -> None:
    """Segments, time in each state, and operation marks, one table each; then the pods'
    lifecycles and, if any, their waits for their claims (`waits`)."""
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
    waits = waits or []
    pods = sorted({tl.pod_uid for tl in chosen if tl.pod_uid} | {w.pod_uid for w in waits})
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
    if waits:
        print_line("")
        print_table(
            "Pending pods (waiting for their claims; nothing mounted meanwhile)",
            ["POD", "FROM", "TO", "DURATION", "WAITING FOR", "THEN"],
            _pending_rows(waits, end_us),
        )


def timeline_json(
    tls: Timelines, chosen: list[Timeline], end_us: int, waits: list[PendingSpell] | None = None
) -> dict[str, Any]:
    """Timelines as JSON: segments (µs and ISO), time in state (µs), operation marks;
    `pending`: the pods' waits for their claims (`pending_json`)."""
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
    waits = waits or []
    pods = sorted({tl.pod_uid for tl in chosen if tl.pod_uid} | {w.pod_uid for w in waits})
    return {
        "end_us": end_us,
        "end": fmt_ts(end_us),
        "timelines": items,
        "pods": [to_builtins(tls.pods[uid]) for uid in pods if uid in tls.pods],
        "pending": [pending_json(w, end_us) for w in waits],
    }


def select_waits(
    tls: Timelines, volume: str | None, uids: list[str], since_us: int | None
) -> list[PendingSpell]:
    """The waits to show: every pod's, or the pods asked for (none for --volume: a pending
    pod has no volume yet); with --since, the ones still going then or later."""
    if volume is not None:
        return []
    waits = tls.pending.of_pods(uids) if uids else list(tls.pending.spells)
    if since_us is not None:
        waits = [w for w in waits if w.ended_us is None or w.ended_us >= since_us]
    return waits


def load_timelines(log: EventLog, until_us: int | None) -> tuple[Timelines, int]:
    """Timelines of the log (up to `until_us`) and the time open segments run to."""
    until_seq = log.seq_at_time(until_us) if until_us is not None else None
    tls = build_timelines(log.read_after(0, until_seq=until_seq))
    return tls, until_us if until_us is not None else tls.end_us


def clip(chosen: list[Timeline], since_us: int) -> list[Timeline]:
    """The timelines from `since_us` on: earlier segments cut at it, earlier marks dropped.

    The whole log is folded first, so the state at `since_us` is right; a
    timeline with nothing after it keeps its segment that runs through it.
    """
    out = []
    for tl in chosen:
        segments = [
            Segment(seg.state, max(seg.from_us, since_us), seg.from_seq, seg.to_us, seg.to_seq)
            for seg in tl.segments
            if seg.to_us is None or seg.to_us > since_us
        ]
        if not segments:
            continue
        marks = [m for m in tl.marks if m.ts >= since_us]
        out.append(dataclasses.replace(tl, segments=segments, marks=marks))
    return out


class TimelineOutput(StrEnum):
    """How `timeline` prints."""

    table = "table"
    json = "json"
    html = "html"


def timeline(
    volume: Annotated[
        str | None,
        typer.Option("--volume", help="The device timeline of this volume and its pod volumes."),
    ] = None,
    pod: Annotated[
        str | None,
        typer.Option(
            "--pod",
            help="The pod-volume timelines of this pod: NAMESPACE/NAME (every pod of that name) "
            "or its uid.",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help=f"Show from this time on (states as they were then). {TIME_HELP}"
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Stop at this time; open segments run to it (same forms)."),
    ] = None,
    output: Annotated[
        TimelineOutput,
        typer.Option(
            "--output",
            "-o",
            help="table, json, or html: a self-contained page (bars coloured by state, "
            "operations and errors marked) written to --out-file.",
            case_sensitive=False,
        ),
    ] = TimelineOutput.table,
    out_file: Annotated[
        Path | None,
        typer.Option("--out-file", help="Write here instead of stdout.", dir_okay=False),
    ] = None,
    html: Annotated[
        Path | None, typer.Option("--html", hidden=True, dir_okay=False)
    ] = None,  # the old spelling of -o html --out-file OUT
    data_dir: DataDirOpt = None,
    db: DbOpt = None,
) -> None:
    """Show when each device / pod volume was in which state, and its operations.

    Open segments (the current state) are measured up to the last event of the
    log, or to --until. With -o html --out-file OUT the same timelines are drawn
    as an offline HTML page.
    """
    if volume is not None and pod is not None:
        raise typer.BadParameter("give --volume or --pod, not both", param_hint="--volume/--pod")
    if html is not None:
        output, out_file = TimelineOutput.html, html
    if output is TimelineOutput.html and out_file is None:
        raise typer.BadParameter("-o html needs --out-file FILE", param_hint="--out-file")
    since_us = parse_time(since, option="--since") if since is not None else None
    until_us = parse_time(until, option="--until") if until is not None else None
    with open_log(data_dir, db) as log:
        try:
            uids = [p.uid for p in resolve_pods(log, pod)] if pod is not None else []
            if volume is not None:
                check_volume(log, volume)
        except (UnknownNameError, ValueError) as exc:
            fail(str(exc))
        tls, end_us = load_timelines(log, until_us)
        node = log.node
    chosen = _select(tls, volume, uids)
    waits = select_waits(tls, volume, uids, since_us)
    if since_us is not None:
        chosen = clip(chosen, since_us)
    if output is TimelineOutput.html:
        assert out_file is not None
        _write_html(out_file, tls, chosen, end_us, node, _subject(tls, volume, uids), waits)
        return
    with to_file(out_file):
        if output is TimelineOutput.json:
            print_json(timeline_json(tls, chosen, end_us, waits))
        else:
            print_timeline_tables(tls, chosen, end_us, waits)


def _subject(tls: Timelines, volume: str | None, uids: list[str]) -> str | None:
    if volume is not None:
        return f"volume {volume}"
    if uids:
        known = tls.pods.get(uids[-1])
        return f"pod {known.namespace}/{known.name}" if known is not None else f"pod {uids[-1]}"
    return None


def _write_html(
    path: Path,
    tls: Timelines,
    chosen: list[Timeline],
    end_us: int,
    node: str,
    what: str | None,
    waits: list[PendingSpell],
) -> None:
    title = f"volfsm timeline: {what}" if what else f"volfsm timeline: node {node or '?'}"
    page = render_timeline_html(tls, chosen, end_us, title=title, node=node, waits=waits)
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        fail(f"{path}: cannot write ({exc.strerror})")
    bars = sum(len(tl.segments) for tl in chosen)
    print_line(f"wrote {len(chosen)} timelines ({bars} bars) to {path}")


def register(app: typer.Typer) -> None:
    """Add `timeline` to the CLI."""
    app.command("timeline")(timeline)
