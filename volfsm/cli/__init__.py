"""The `volfsm` command line (Typer).

One Typer app; each command group lives in its own module with a
`register(app)` function, listed in `COMMAND_GROUPS`. Adding the service
commands (serve, apply, get, wait) means adding a module and one entry.
"""

from __future__ import annotations

from collections.abc import Callable

import typer

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
    timeline,
    validate,
)

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
    replay.register,
    diff.register,
    explain.register,
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
