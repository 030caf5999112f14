"""What every offline command shares: the log options, opening the log, time arguments.

Errors a user can cause (no log, a foreign or newer file, a bad time) end
the command with one line on stderr naming the path and exit code 2.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from events.errors import LogMissingError, LogOpenError, UnknownEventError
from projections import textfmt
from volfsm.paths import DATA_DIR_ENV, DEFAULT_DATA_DIR, LOG_FILENAME, log_path

if TYPE_CHECKING:
    from events.log import EventLog

EXIT_USAGE = 2
"""Exit code for a bad argument or an unusable log file."""


class Output(StrEnum):
    """How a listing is printed."""

    table = "table"
    json = "json"


DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar=DATA_DIR_ENV,
        help=f"Data dir holding the log ({LOG_FILENAME}). Default: {DEFAULT_DATA_DIR}.",
        show_default=False,
    ),
]
DbOpt = Annotated[
    Path | None,
    typer.Option("--db", help="The log file itself (overrides --data-dir).", show_default=False),
]
OutputOpt = Annotated[
    Output, typer.Option("--output", "-o", help="Output format.", case_sensitive=False)
]


def fail(message: str) -> NoReturn:
    """Print `volfsm: error: <message>` to stderr and exit with code 2."""
    typer.echo(f"volfsm: error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


@contextmanager
def open_log(data_dir: Path | None, db: Path | None) -> Iterator[EventLog]:
    """The log named by the options, opened read-only; user-caused errors exit 2."""
    from events.log import EventLog  # sqlite-utils: only for commands that read a log

    path = log_path(data_dir, db)
    if path.is_dir():
        fail(f"{path}: is a directory, not a volfsm event log (--db takes the log file)")
    try:
        log = EventLog(path, readonly=True)
    except LogMissingError as exc:
        fail(f"{exc} (pass --data-dir DIR or --db FILE, or run `volfsm demo` to write a sample)")
    except LogOpenError as exc:
        fail(str(exc))
    except (sqlite3.Error, OSError) as exc:
        fail(f"{path}: cannot be read as a volfsm event log ({exc})")
    try:
        yield log
    except UnknownEventError as exc:
        fail(f"{path}: {exc}")
    except sqlite3.Error as exc:
        fail(f"{path}: read failed ({exc})")
    finally:
        log.close()


def parse_time(text: str, *, option: str, now_us: int | None = None) -> int:
    """A TIME argument as UTC µs (`projections.textfmt.parse_time`); a bad one names `option`."""
    try:
        return textfmt.parse_time(text, now_us)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


@contextmanager
def to_file(path: Path | None) -> Iterator[None]:
    """Send what the block prints to stdout to `path` instead (nothing changes for None)."""
    if path is None:
        yield
        return
    try:
        out = path.open("w", encoding="utf-8")
    except OSError as exc:
        fail(f"{path}: cannot write ({exc.strerror})")
    with out, contextlib.redirect_stdout(out):
        yield


OutFileOpt = Annotated[
    Path | None,
    typer.Option("--out-file", help="Write to this file instead of stdout.", dir_okay=False),
]
