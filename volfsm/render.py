"""Output helpers for the CLI: timestamps, durations, sizes, tables and JSON.

Tables go through rich when stdout is a terminal and are printed as plain,
space-aligned text otherwise (pipes, files, tests), so `grep` and `awk`
work on them. JSON is indented, UTF-8, with keys in a stable order.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import msgspec

from projections.textfmt import duration_text, iso_time, size_text

STATE_STYLES = {
    "Uncertain": "bold yellow",
    "Mounted": "green",
    "DeviceGloballyMounted": "green",
    "Attached": "cyan",
    "failed": "red",
    "running": "yellow",
}


_KEEP_WHOLE = 26
"""Terminal tables keep columns up to this wide on one line (an ISO time is 24)."""


def fmt_ts(ts_us: int | None) -> str:
    """A UTC µs timestamp as ISO 8601 with milliseconds and `Z` ('' for None)."""
    return iso_time(ts_us)


def fmt_duration(us: int) -> str:
    """A duration in µs for humans: '0.450s', '15.000s', '2m03.500s', '1h02m03s'."""
    return duration_text(us)


def fmt_bytes(n: int | None) -> str:
    """A size in bytes with a binary unit ('' for None)."""
    return "" if n is None else size_text(n)


def to_builtins(obj: Any) -> Any:
    """Dataclasses, msgspec Structs and containers as plain JSON-able values."""
    return msgspec.to_builtins(obj)


def json_text(obj: Any) -> str:
    """Indented JSON text of `obj` (dataclasses and Structs included)."""
    return msgspec.json.format(msgspec.json.encode(obj), indent=2).decode()


def print_json(obj: Any, out: TextIO | None = None) -> None:
    """Write `obj` as indented JSON and a newline."""
    stream = out if out is not None else sys.stdout
    stream.write(json_text(obj) + "\n")


def _plain_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(c) for c in columns]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [title] if title else []
    out.append(line(columns))
    out.extend(line(r) for r in rows)
    if not rows:
        out.append("(none)")
    return "\n".join(out) + "\n"


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
    out: TextIO | None = None,
) -> None:
    """Print a table: rich on a terminal, plain aligned text otherwise."""
    stream = out if out is not None else sys.stdout
    materialized = [list(r) for r in rows]
    if not _is_terminal(stream):
        stream.write(_plain_table(title, columns, materialized))
        return
    from rich import box  # rich only on a terminal: it is slow to import
    from rich.console import Console
    from rich.table import Table

    console = Console(file=stream, highlight=False)
    table = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD)
    for i, col in enumerate(columns):
        widest = max([len(col), *(len(row[i]) for row in materialized)])
        if widest <= _KEEP_WHOLE:  # states, times, sizes: never broken across lines
            table.add_column(col, no_wrap=True, min_width=widest)
        else:  # ids and paths share what is left, folded
            table.add_column(col, overflow="fold", ratio=1)
    for row in materialized:
        table.add_row(*(_styled(cell) for cell in row))
    if not materialized:
        table.add_row(*(["(none)"] + [""] * (len(columns) - 1)))
    console.print(table)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _styled(cell: str) -> str:
    from rich.markup import escape

    style = STATE_STYLES.get(cell.split(" ", 1)[0])
    text = escape(cell)
    return text if style is None else f"[{style}]{text}[/]"


def print_line(text: str, out: TextIO | None = None) -> None:
    """Print one plain line (no markup interpretation)."""
    stream = out if out is not None else sys.stdout
    stream.write(text + "\n")
