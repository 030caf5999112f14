"""`volfsm export`: the log as ndjson, one public JSON envelope per line."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, BinaryIO

import typer

from events.types import Envelope
from projections.export import write_ndjson
from projections.textfmt import TIME_HELP
from volfsm.cli.common import DataDirOpt, DbOpt, fail, open_log, parse_time
from volfsm.cli.replay import progress_bar, progress_wanted


class ExportFormat(StrEnum):
    """Export formats."""

    ndjson = "ndjson"


def export(
    output: Annotated[
        str,
        typer.Option("--output", "-o", help="The format: ndjson.", metavar="<ndjson>"),
    ] = ExportFormat.ndjson.value,
    out_file: Annotated[
        str, typer.Option("--out-file", help="Write to this file ('-': stdout).", metavar="FILE")
    ] = "-",
    since: Annotated[
        str | None, typer.Option("--since", help=f"Only events at or after this time. {TIME_HELP}")
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Only events at or before this time (same forms)."),
    ] = None,
    after_seq: Annotated[
        int, typer.Option("--after-seq", min=0, help="Only events with a seq above this.")
    ] = 0,
    format_: Annotated[str | None, typer.Option("--format", hidden=True)] = None,  # old -o
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            help="Progress bar on stderr (default: on long exports when stdout and stderr "
            "are terminals).",
            show_default=False,
        ),
    ] = None,
    data_dir: DataDirOpt = None,
    db: DbOpt = None,
) -> None:
    """Export events in log order (the same JSON envelopes NATS carries)."""
    output, out_file = _format_and_file(format_ or output, out_file)
    since_us = parse_time(since, option="--since") if since is not None else None
    until_us = parse_time(until, option="--until") if until is not None else None
    with open_log(data_dir, db) as log:
        after = after_seq
        if since_us is not None:
            after = max(after, log.seq_at_time(since_us - 1))
        last = log.seq_at_time(until_us) if until_us is not None else log.last_seq()
        total = max(0, last - after)
        enabled = progress_wanted(progress, total)
        with progress_bar(enabled, total, "exporting") as wrap:
            envs = _counted(log.read_after(after, until_seq=last), wrap(_ignore))
            if out_file == "-":
                stdout = typer.get_binary_stream("stdout")
                write_ndjson(envs, stdout)
                stdout.flush()
                return
            target = Path(out_file)
            try:
                fh: BinaryIO = target.open("wb")
            except OSError as exc:
                fail(f"{target}: cannot write ({exc.strerror})")
            with fh:
                count = write_ndjson(envs, fh)
    typer.echo(f"wrote {count} events to {target}", err=True)


def _format_and_file(output: str, out_file: str) -> tuple[str, str]:
    """(format, file): `-o` names the format; an old `-o FILE` still writes FILE (with a note)."""
    if output.lower() in {f.value for f in ExportFormat}:
        return output.lower(), out_file
    if out_file != "-":
        fail(f"-o/--output is the format ({', '.join(ExportFormat)}), not {output!r}")
    typer.echo(f"volfsm: note: -o FILE is now --out-file {output} (-o names the format)", err=True)
    return ExportFormat.ndjson.value, output


def _ignore(env: Envelope) -> None:
    return None


def _counted(envs: Iterable[Envelope], tick: Callable[[Envelope], None]) -> Iterator[Envelope]:
    for env in envs:
        tick(env)
        yield env


def register(app: typer.Typer) -> None:
    """Add `export` to the CLI."""
    app.command("export")(export)
