"""State as of a point in the log: the ASW fold with a stop condition.

Works on any iterable of envelopes in `seq` order: the whole log
(`EventLog.read_after(0)`), a log already cut with `until_seq`, or an
ndjson export. Timestamps never go backwards in a volfsm log, so "as of a
time" stops at the first envelope stamped after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from events.types import Envelope
from projections.asw import Asw, fold


def until_seq(envelopes: Iterable[Envelope], seq: int) -> Iterator[Envelope]:
    """The envelopes with `seq` at or below `seq`; stops reading at the first above it."""
    for env in envelopes:
        if env.seq > seq:
            return
        yield env


def until_time(envelopes: Iterable[Envelope], ts_us: int) -> Iterator[Envelope]:
    """The envelopes stamped at or before `ts_us` (UTC µs); stops at the first after it."""
    for env in envelopes:
        if env.ts > ts_us:
            return
        yield env


def state_at_seq(envelopes: Iterable[Envelope], seq: int) -> Asw:
    """The ASW right after `seq` was applied (everything up to and including it)."""
    return fold(until_seq(envelopes, seq))


def state_at_time(envelopes: Iterable[Envelope], ts_us: int) -> Asw:
    """The ASW at `ts_us`: every event stamped at or before it applied."""
    return fold(until_time(envelopes, ts_us))
