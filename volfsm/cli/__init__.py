"""The `volfsm` command line (Typer).

One Typer app; each command group lives in its own module with a
`register(app)` function, listed in `COMMAND_GROUPS`. Adding the service
commands (serve, apply, get, wait) means adding a module and one entry.

`volfsm analytics ...` is the Typer app of `volfsm.analytics.cli`, added as
a sub-command group (`register_analytics`); that package never imports
`volfsm.cli`, so `python -m volfsm.analytics` runs the same commands alone.
"""

from __future__ import annotations

from collections.abc import Callable

import typer

from volfsm.analytics import cli as analytics_cli
from volfsm.cli import (
    demo,
    diagram,
    diff,
    explain,
    export,
    history,
    ops,
    replay,
    serve,
    state,
    stream,
    timeline,
    validate,
)


def register_analytics(app: typer.Typer) -> None:
    """Add `volfsm analytics serve|report|export` (the aggregator, its report and export)."""
    app.add_typer(analytics_cli.app, name="analytics")


COMMAND_GROUPS: tuple[Callable[[typer.Typer], None], ...] = (
    state.register,
    history.register,
    timeline.register,
    validate.register,
    export.register,
    diagram.register,
    demo.register,
    serve.register,
    ops.register,
    stream.register,
    replay.register,
    diff.register,
    explain.register,
    register_analytics,
)


def build_app() -> typer.Typer:
    """A fresh `volfsm` Typer app with every command group registered."""
    app = typer.Typer(
        name="volfsm",
        help="volfsm: a node volume manager as an event-sourced state machine.\n\n"
        "The read commands work offline on a log file (--data-dir DIR or --db FILE).",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,
    )
    for register in COMMAND_GROUPS:
        register(app)
    return app


app = build_app()


def main() -> None:
    """Console-script entry point."""
    app()
