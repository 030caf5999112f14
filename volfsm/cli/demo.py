"""`volfsm demo`: write a realistic sample history to try every read command on."""

from __future__ import annotations

from typing import Annotated

import typer

from events.errors import LogOpenError
from projections.textfmt import TIME_HELP
from volfsm.cli.common import DataDirOpt, DbOpt, fail, parse_time
from volfsm.cli.demolog import DEMO_NODE, LogNotEmptyError, write_demo
from volfsm.paths import log_path
from volfsm.render import fmt_ts, print_line


def demo(
    data_dir: DataDirOpt = None,
    db: DbOpt = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Same seed (and --end): same ids and times.")
    ] = None,
    at: Annotated[
        str | None, typer.Option("--at", help=f"Time of the last event (default now). {TIME_HELP}")
    ] = None,
    end: Annotated[str | None, typer.Option("--end", hidden=True)] = None,  # old --at
    node: Annotated[str, typer.Option("--node", help="Node name stamped on events.")] = DEMO_NODE,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Replace a demo log that already holds events (never a log a service wrote).",
        ),
    ] = False,
) -> None:
    """Write about five minutes of a node's volume history into a new log."""
    at = at if at is not None else end
    end_us = parse_time(at, option="--at") if at is not None else None
    path = log_path(data_dir, db)
    try:
        result = write_demo(path, seed=seed, end_us=end_us, force=force, node=node)
    except (LogNotEmptyError, LogOpenError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{path}: cannot write ({exc.strerror})")
    print_line(
        f"wrote {result.events} events (seq 1-{result.last_seq}, "
        f"{fmt_ts(result.start_us)} .. {fmt_ts(result.end_us)}) to {result.path}"
    )
    where = f"--db {result.path}" if db is not None else f"--data-dir {result.path.parent}"
    print_line(f"try: volfsm state {where}   (also: history, timeline, validate, export)")


def register(app: typer.Typer) -> None:
    """Add `demo` to the CLI."""
    app.command("demo")(demo)
