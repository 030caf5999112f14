"""What every offline command shares: the log options, opening the log, time arguments.

Errors a user can cause (no log, a foreign or newer file, a bad time) end
the command with one line on stderr naming the path and exit code 2.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from events.errors import LogMissingError, LogOpenError, UnknownEventError
from events.log import EventLog
from volfsm.paths import DATA_DIR_ENV, DEFAULT_DATA_DIR, LOG_FILENAME, log_path

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

TIME_HELP = (
    "ISO 8601 time, e.g. 2024-05-01T03:10:00Z or 2024-05-01T05:10:00+02:00 (no offset: UTC), "
    "'now', or relative to now: -90s, -5m, -2h, -1d."
)


def fail(message: str) -> NoReturn:
    """Print `volfsm: error: <message>` to stderr and exit with code 2."""
    typer.echo(f"volfsm: error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


@contextmanager
def open_log(data_dir: Path | None, db: Path | None) -> Iterator[EventLog]:
    """The log named by the options, opened read-only; user-caused errors exit 2."""
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


_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, *, option: str, now_us: int | None = None) -> int:
    """A TIME argument as UTC µs: ISO 8601 (Z / offset / naive=UTC), 'now', or '-5m'."""
    now = now_us if now_us is not None else time.time_ns() // 1000
    value = text.strip()
    if value == "now":
        return now
    rel = _RELATIVE.match(value)
    if rel is not None:
        return now - round(float(rel.group(1)) * _UNIT_S[rel.group(2)] * 1_000_000)
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a time. Use {TIME_HELP}", param_hint=option
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
