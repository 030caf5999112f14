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


class DiagramOutput(StrEnum):
    """How the diagrams are printed."""

    mermaid = "mermaid"
    markdown = "markdown"


def diagram(
    machine: Annotated[
        Machine | None, typer.Argument(help="device or podvol (default: both).")
    ] = None,
    output: Annotated[
        DiagramOutput,
        typer.Option(
            "--output",
            "-o",
            help="mermaid, or markdown: each diagram in a ```mermaid fence.",
            case_sensitive=False,
        ),
    ] = DiagramOutput.mermaid,
    markdown: Annotated[bool, typer.Option("--markdown", hidden=True)] = False,  # old -o markdown
) -> None:
    """Print the device and/or pod-volume FSM as a mermaid stateDiagram-v2."""
    fenced = markdown or output is DiagramOutput.markdown
    diagrams = all_diagrams()
    names = [machine.value] if machine is not None else list(diagrams)
    for i, name in enumerate(names):
        if i:
            print_line("")
        text = diagrams[name].rstrip("\n")
        print_line(f"```mermaid\n{text}\n```" if fenced else text)


def register(app: typer.Typer) -> None:
    """Add `diagram` to the CLI."""
    app.command("diagram")(diagram)
