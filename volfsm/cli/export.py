"""`volfsm export`: the log as ndjson, one public JSON envelope per line."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, BinaryIO

import typer

from events.types import Envelope
from projections.export import write_ndjson
from volfsm.cli.common import DataDirOpt, DbOpt, fail, open_log
from volfsm.cli.replay import progress_bar, progress_wanted


class ExportFormat(StrEnum):
    """Export formats."""

    ndjson = "ndjson"


def export(
    format_: Annotated[
        ExportFormat, typer.Option("--format", help="Export format.", case_sensitive=False)
    ] = ExportFormat.ndjson,
    output: Annotated[str, typer.Option("--output", "-o", help="Output file ('-': stdout).")] = "-",
    after_seq: Annotated[
        int, typer.Option("--after-seq", min=0, help="Only events with a seq above this.")
    ] = 0,
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
    with open_log(data_dir, db) as log:
        total = max(0, log.last_seq() - after_seq)
        enabled = progress_wanted(progress, total)
        with progress_bar(enabled, total, "exporting") as wrap:
            envs = _counted(log.read_after(after_seq), wrap(_ignore))
            if output == "-":
                stdout = typer.get_binary_stream("stdout")
                write_ndjson(envs, stdout)
                stdout.flush()
                return
            target = Path(output)
            try:
                fh: BinaryIO = target.open("wb")
            except OSError as exc:
                fail(f"{target}: cannot write ({exc.strerror})")
            with fh:
                count = write_ndjson(envs, fh)
    typer.echo(f"wrote {count} events to {target}", err=True)


def _ignore(env: Envelope) -> None:
    return None


def _counted(envs: Iterable[Envelope], tick: Callable[[Envelope], None]) -> Iterator[Envelope]:
    for env in envs:
        tick(env)
        yield env


def register(app: typer.Typer) -> None:
    """Add `export` to the CLI."""
    app.command("export")(export)
