"""`volfsm diff`: what changed between two moments of the log."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import typer

from projections.diff import EntryChange, WorldDiff, diff_log
from projections.textfmt import TIME_HELP
from volfsm.cli.common import DataDirOpt, DbOpt, Output, OutputOpt, open_log, parse_time
from volfsm.render import fmt_bytes, fmt_ts, print_json, print_line, print_table


def _moment(asked_us: int | None, seq: int) -> str:
    when = fmt_ts(asked_us) if asked_us is not None else "the end of the log"
    return f"{when} (seq {seq})"


def _entry_rows(changes: list[EntryChange]) -> list[list[str]]:
    return [
        [
            c.change,
            c.subject,
            c.from_state or "-",
            c.to_state or "-",
            str(c.events),
            "; ".join(([f"via {', '.join(c.via)}"] if c.via else []) + c.details),
        ]
        for c in changes
    ]


def _print_pods(diff: WorldDiff) -> None:
    """The desired pods that changed; a DETAIL column when a pod waited for its claims."""
    columns = ["CHANGE", "POD", "UID", "VOLUMES"]
    rows = [[p.change, p.pod, p.pod_uid, ", ".join(p.volumes)] for p in diff.pods]
    if any(p.details for p in diff.pods):
        columns.append("DETAIL")
        for row, p in zip(rows, diff.pods, strict=True):
            row.append("; ".join(p.details))
    print_table("Desired pods", columns, rows)


def print_diff(diff: WorldDiff, node: str, from_us: int, to_us: int | None) -> None:
    """The diff as text: a heading line, then one table per kind of change."""
    print_line(
        f"node {node or '?'}: from {_moment(from_us, diff.from_seq)} "
        f"to {_moment(to_us, diff.to_seq)}: {diff.events} events between"
    )
    if diff.empty:
        print_line("nothing changed")
        return
    print_line("")
    _print_pods(diff)
    if diff.desired_sizes:
        print_line("")
        print_table(
            "Desired sizes",
            ["VOLUME", "FROM", "TO"],
            [
                [s.volume_id, fmt_bytes(s.from_bytes) or "-", fmt_bytes(s.to_bytes) or "-"]
                for s in diff.desired_sizes
            ],
        )
    columns = ["CHANGE", "{}", "FROM", "TO", "EVENTS", "DETAIL"]
    print_line("")
    print_table(
        "Devices",
        [c.format("DEVICE") for c in columns],
        _entry_rows(diff.devices),
    )
    print_line("")
    print_table(
        "Pod volumes",
        [c.format("POD:VOLUME") for c in columns],
        _entry_rows(diff.pod_volumes),
    )


def diff_json(diff: WorldDiff, node: str, from_us: int, to_us: int | None) -> dict[str, Any]:
    """The diff as JSON: the moments asked (`from`, `to`; null = end of log), then the diff.

    `from_seq` / `to_seq` are the last events at or before each moment;
    `from_ts` / `to_ts` their times (0 before the first event). A pod that waited for its
    claims has `details` (since when, for what, how the wait ended).
    """
    doc: dict[str, Any] = {
        "node": node,
        "from": fmt_ts(from_us),
        "to": fmt_ts(to_us) or None,
    }
    doc.update(msgspec.to_builtins(diff))
    for pod in doc["pods"]:
        if not pod["details"]:
            del pod["details"]  # only a pod that waited for its claims has them
    return doc


def diff(
    since: Annotated[
        str | None,
        typer.Option("--since", help=f"The earlier moment. {TIME_HELP}", show_default=False),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="The later moment (same forms; default: the end of the log)."),
    ] = None,
    from_: Annotated[str | None, typer.Option("--from", hidden=True)] = None,  # old --since
    to: Annotated[str | None, typer.Option("--to", hidden=True)] = None,  # old --until
    output: OutputOpt = Output.table,
    data_dir: DataDirOpt = None,
    db: DbOpt = None,
) -> None:
    """Show what changed between two moments: desired pods, devices, pod volumes.

    Each device and pod volume that was added, removed or changed state is
    listed with its state at both moments, the states it passed through and
    the number of its events in between; "touched" entries kept their state
    but had events (e.g. operations that failed and changed nothing).
    """
    since = since if since is not None else from_
    until = until if until is not None else to
    if since is None:
        raise typer.BadParameter("give the earlier moment, --since TIME", param_hint="--since")
    from_us = parse_time(since, option="--since")
    to_us = parse_time(until, option="--until") if until is not None else None
    if to_us is not None and to_us < from_us:
        raise typer.BadParameter("--until is before --since", param_hint="--until")
    with open_log(data_dir, db) as log:
        from_seq = log.seq_at_time(from_us)
        to_seq = log.seq_at_time(to_us) if to_us is not None else log.last_seq()
        result = diff_log(log.read_after(0, until_seq=to_seq), from_seq, to_seq)
        node = log.node
    if output is Output.json:
        print_json(diff_json(result, node, from_us, to_us))
    else:
        print_diff(result, node, from_us, to_us)


def register(app: typer.Typer) -> None:
    """Add `diff` to the CLI."""
    app.command("diff")(diff)
