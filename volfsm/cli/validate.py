"""`volfsm validate`: check that the log tells a legal story (exit 1 at the first violation)."""

from __future__ import annotations

from typing import Any

import typer

from projections.validate import ValidationReport, validate
from volfsm.cli.common import DataDirOpt, DbOpt, Output, OutputOpt, open_log
from volfsm.render import print_json, print_line, to_builtins

EXIT_INVALID = 1


def report_json(report: ValidationReport) -> dict[str, Any]:
    """The report as JSON: ok, counts, and the first violation (or null)."""
    return {
        "ok": report.ok,
        "events": report.events,
        "streams": report.streams,
        "last_valid_seq": report.last_seq,
        "violation": to_builtins(report.violation) if report.violation else None,
    }


def validate_cmd(
    output: OutputOpt = Output.table,
    data_dir: DataDirOpt = None,
    db: DbOpt = None,
) -> None:
    """Check every stream against the transition tables; report the first violation.

    Exit code 0: valid; 1: a violation (printed with its seq); 2: no readable log.
    """
    with open_log(data_dir, db) as log:
        report = validate(log.read_after(0))
    if output is Output.json:
        print_json(report_json(report))
    elif report.violation is None:
        print_line(f"ok: {report.events} events in {report.streams} streams follow the tables")
    else:
        print_line(f"INVALID: {report.violation}")
        print_line(f"({report.events} events before it were valid)")
    if not report.ok:
        raise typer.Exit(EXIT_INVALID)


def register(app: typer.Typer) -> None:
    """Add `validate` to the CLI."""
    app.command("validate")(validate_cmd)
