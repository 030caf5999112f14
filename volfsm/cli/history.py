"""`volfsm history`: the events of the log, filtered by stream, volume, pod, time and type."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import msgspec
import typer

from events.codec import envelope_to_json
from events.log import EventLog
from events.streams import stream_kind
from events.types import EVENT_TYPES, Envelope, PodAdded
from projections.history import EventFilter, select
from projections.textfmt import TIME_HELP
from volfsm.cli.common import DataDirOpt, DbOpt, Output, OutputOpt, fail, open_log, parse_time
from volfsm.cli.refs import UnknownNameError, check_streams, check_volume, resolve_pods
from volfsm.render import fmt_ts, print_json, print_table

_IMPLIED_BY_STREAM = {
    "device": {"volume_id"},
    "podvol": {"pod_uid", "volume_name"},
    "pod": {"pod_uid"},
    "object": {"kind", "namespace", "name"},
}


def _field_text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, bool):
        return str(value).lower()
    text = ",".join(str(v) for v in value) if isinstance(value, tuple | list) else str(value)
    return f'"{text}"' if " " in text else text


def event_details(env: Envelope) -> str:
    """The body's informative fields as `key=value` text (defaults and stream keys left out)."""
    body = env.body
    if isinstance(body, PodAdded):
        vols = ", ".join(f"{v.name}={v.volume_id}" for v in body.volumes)
        return f"{body.namespace}/{body.name} volumes: {vols}"
    implied = _IMPLIED_BY_STREAM.get(stream_kind(env.stream), set())
    parts = []
    for f in msgspec.structs.fields(body):
        value = getattr(body, f.name)
        if f.name in implied or (f.required is False and value == f.default):
            continue
        parts.append(f"{f.name}={_field_text(value)}")
    return " ".join(parts)


def _check_types(types: list[str]) -> frozenset[str]:
    unknown = [t for t in types if t not in EVENT_TYPES]
    if unknown:
        raise typer.BadParameter(
            f"unknown event type(s) {', '.join(unknown)}; known: {', '.join(EVENT_TYPES)}",
            param_hint="--type",
        )
    return frozenset(types)


def _read(log: EventLog, flt: EventFilter) -> Iterator[Envelope]:
    until = log.seq_at_time(flt.until_us) if flt.until_us is not None else None
    start = 0
    # Volume links are learnt from earlier events, so a volume filter reads from the start.
    if flt.since_us is not None and flt.volume_id is None:
        start = log.seq_at_time(flt.since_us - 1)
    return select(log.read_after(start, until_seq=until), flt)


def history(
    stream: Annotated[
        list[str] | None, typer.Option("--stream", help="Only this stream (repeatable).")
    ] = None,
    volume: Annotated[
        str | None,
        typer.Option("--volume", help="Only events of this volume: device, pod volumes, desired."),
    ] = None,
    pod: Annotated[
        str | None,
        typer.Option(
            "--pod",
            help="Only events of this pod, NAMESPACE/NAME (every pod of that name) or its uid "
            "(desired state and volumes).",
        ),
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help=f"Events at or after this time. {TIME_HELP}")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Events at or before this time (same forms).")
    ] = None,
    type_: Annotated[
        list[str] | None,
        typer.Option("--type", help="Only this event type, e.g. OperationFailed (repeatable)."),
    ] = None,
    output: OutputOpt = Output.table,
    data_dir: DataDirOpt = None,
    db: DbOpt = None,
) -> None:
    """List events in log order, with filters (all given filters must match)."""
    since_us = parse_time(since, option="--since") if since is not None else None
    until_us = parse_time(until, option="--until") if until is not None else None
    types = _check_types(type_ or [])
    with open_log(data_dir, db) as log:
        try:
            uids = frozenset(p.uid for p in resolve_pods(log, pod)) if pod is not None else None
            if volume is not None:
                check_volume(log, volume)
            check_streams(log, stream or ())
        except (UnknownNameError, ValueError) as exc:
            fail(str(exc))
        flt = EventFilter(
            streams=frozenset(stream or ()),
            volume_id=volume,
            pod_uids=uids or frozenset(),
            since_us=since_us,
            until_us=until_us,
            types=types,
        )
        envs = list(_read(log, flt))
    if output is Output.json:
        print_json([msgspec.Raw(envelope_to_json(e)) for e in envs])
        return
    print_table(
        f"{len(envs)} events",
        ["SEQ", "TIME", "STREAM", "V", "TYPE", "DETAILS"],
        [
            [str(e.seq), fmt_ts(e.ts), e.stream, str(e.version), e.type, event_details(e)]
            for e in envs
        ],
    )


def register(app: typer.Typer) -> None:
    """Add `history` to the CLI."""
    app.command("history")(history)
