"""Exports of the log: ndjson, one JSON envelope per line.

Each line is exactly the public JSON envelope (`events.codec.envelope_to_json`,
the same form published on NATS), so an export can be read back with
`events.codec.envelope_from_json` and folded like the log itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import BinaryIO

from events.codec import envelope_from_json, envelope_to_json
from events.types import Envelope


def ndjson_lines(envelopes: Iterable[Envelope]) -> Iterator[bytes]:
    """One JSON envelope per item, each ending in a newline."""
    for env in envelopes:
        yield envelope_to_json(env) + b"\n"


def write_ndjson(envelopes: Iterable[Envelope], out: BinaryIO) -> int:
    """Write envelopes as ndjson to `out`; the number of lines written."""
    count = 0
    for line in ndjson_lines(envelopes):
        out.write(line)
        count += 1
    return count


def read_ndjson(lines: Iterable[bytes | str]) -> Iterator[Envelope]:
    """Envelopes back from ndjson lines (blank lines skipped; old schemas upcast)."""
    for line in lines:
        if line.strip():
            yield envelope_from_json(line)
