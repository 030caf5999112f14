"""The rows a big fold reads (`EventLog.scan_fold`, `projections.asw.Asw.fold_rows`).

A fold of the whole log (an engine start) spends most of its time moving
rows from SQLite into Python, and each column of a row costs about as much
as a few lines of the fold. So a fold row has only the columns the fold
uses: (stream, version, ts, body, legacy). `legacy` is None when the row's
(type, schema) is one this build writes, so the body is decoded by its own
tag (the type name is in the body); otherwise it is "<type>:<schema>" and
the body goes through `events.codec.decode_body` (upcast). `seq` is not
read per row: `FoldRows.last_seq` is the seq of the last row, read in the
same snapshot before the rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

FoldRow = tuple[str, int, int, bytes, str | None]
"""(stream, version, ts, body bytes, legacy) as `FoldRows` gives them."""


@dataclass(slots=True)
class FoldRows:
    """One scan for a fold: its rows in seq order and the seq of the last of them."""

    rows: Iterator[FoldRow]
    last_seq: int
    """The seq of the last row `rows` gives (the scan's `after` if it gives none)."""

    def __iter__(self) -> Iterator[FoldRow]:
        return self.rows


def legacy_column(current: Mapping[str, int]) -> str:
    """SQL for the `legacy` column: NULL for a row of a current (type, schema), else "type:schema".

    `current` maps type name -> schema (`events.codec.CURRENT_SCHEMAS`). The
    test is cheap for SQLite: the schema most types have, excluding the few
    types with another one, or one of those. A type this build does not know
    may pass it as current; its body's tag then fails to decode, and the fold
    reports the type as unknown (`projections.asw`).
    """
    by_schema: dict[int, list[str]] = {}
    for name, schema in current.items():
        by_schema.setdefault(schema, []).append(name)
    common = max(by_schema, key=lambda s: len(by_schema[s]))
    others = [name for s, names in by_schema.items() if s != common for name in names]
    tests = [f"schema = {common}" + (f" AND type NOT IN ({_quoted(others)})" if others else "")]
    tests += [
        f"schema = {s} AND type IN ({_quoted(names)})"
        for s, names in sorted(by_schema.items())
        if s != common
    ]
    return f"CASE WHEN {' OR '.join(tests)} THEN NULL ELSE type || ':' || schema END"


def _quoted(names: list[str]) -> str:
    for name in names:
        if not name.isidentifier():
            raise ValueError(f"event type name {name!r} is not an identifier")
    return ", ".join(f"'{name}'" for name in names)
