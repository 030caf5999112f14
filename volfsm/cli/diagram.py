"""`volfsm diagram`: the state machines as mermaid, generated from the tables."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from projections.diagram import all_diagrams
from volfsm.render import print_line


class Machine(StrEnum):
    """Which state machine to draw."""

    device = "device"
    podvol = "podvol"


def diagram(
    machine: Annotated[
        Machine | None, typer.Argument(help="device or podvol (default: both).")
    ] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Wrap each diagram in a ```mermaid fence.")
    ] = False,
) -> None:
    """Print the device and/or pod-volume FSM as a mermaid stateDiagram-v2."""
    diagrams = all_diagrams()
    names = [machine.value] if machine is not None else list(diagrams)
    for i, name in enumerate(names):
        if i:
            print_line("")
        text = diagrams[name].rstrip("\n")
        print_line(f"```mermaid\n{text}\n```" if markdown else text)


def register(app: typer.Typer) -> None:
    """Add `diagram` to the CLI."""
    app.command("diagram")(diagram)
