"""Mermaid state diagrams generated from the transition tables.

One `stateDiagram-v2` per FSM: an arrow from `[*]` to the initial state and
one edge per (source state, trigger), labelled `trigger / EventType`. A row
whose destination is "stay" (e.g. `resize`) is drawn as a self-loop.
"""

from __future__ import annotations

from events.tables import TABLES, FsmTable


def edges(table: FsmTable) -> list[tuple[str, str, str, str]]:
    """(source, dest, trigger, event) for every (source, trigger) pair of `table`."""
    result: list[tuple[str, str, str, str]] = []
    for t in table.transitions:
        for source in t.sources:
            dest = source if t.dest is None else t.dest
            result.append((source, dest, t.trigger, t.event))
    return result


def mermaid(table: FsmTable) -> str:
    """The mermaid `stateDiagram-v2` text of one FSM (ends with a newline)."""
    lines = ["stateDiagram-v2", f"    %% {table.name} FSM, generated from events/tables.py"]
    lines.append(f"    [*] --> {table.initial}")
    for source, dest, trigger, event in edges(table):
        lines.append(f"    {source} --> {dest}: {trigger} / {event}")
    return "\n".join(lines) + "\n"


def all_diagrams() -> dict[str, str]:
    """The diagram of every FSM, keyed by FSM name ('device', 'podvol')."""
    return {name: mermaid(table) for name, table in TABLES.items()}
