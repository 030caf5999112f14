"""Turning received event messages into one store batch: decode, dedupe, notice gaps, fold.

NATS-free, so the same path serves the aggregator and tests that feed
messages by hand. An `Ingestor` holds the applied ranges and the fold
loaded from the store; `BatchBuilder` collects one batch. Nothing is
committed here: the caller commits the batch, and only then acknowledges.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec
from loguru import logger

from events.errors import UnknownEventError
from projections.analytics import HEALTH_TYPES, AnalyticsFold, EventRow, flatten_json
from volfsm.analytics.store import Batch, Reject, encode_state
from volfsm.analytics.tracking import SeqRanges


class IngestStore(Protocol):
    """What ingesting needs of a store."""

    path: Path
    keeps_state_blob: bool

    def load_state(self) -> tuple[SeqRanges, AnalyticsFold]:
        """The committed applied ranges and open state."""
        ...

    def commit(self, batch: Batch) -> None:
        """Write one batch, all of it or none."""
        ...

    def position(self) -> tuple[str, int] | None:
        """(stream, stream sequence) of the last committed batch."""
        ...


@dataclass(slots=True)
class IngestStats:
    """What this process ingested (since it started)."""

    applied: int = 0
    duplicates: int = 0
    undecodable: int = 0
    gaps: int = 0
    batches: int = 0
    last_commit_us: int = 0


class Ingestor:
    """The committed applied ranges and open state, and the batches built on top of them."""

    def __init__(self, store: IngestStore, clock: Callable[[], int]) -> None:
        self.ranges, self.fold = store.load_state()
        self.keeps_state_blob = store.keeps_state_blob
        self.clock = clock
        self.stats = IngestStats()

    def batch(self) -> BatchBuilder:
        """Start collecting one batch."""
        return BatchBuilder(self)


class BatchBuilder:
    """One batch in the making: `add` each message in delivery order, then `finish`."""

    def __init__(self, ingestor: Ingestor) -> None:
        self._ing = ingestor
        self._accept = ingestor.ranges.accept
        self._apply = ingestor.fold.apply
        self._health = ingestor.fold.health.apply_json
        self._waits = ingestor.fold.waits.apply_json
        self._now = ingestor.clock()
        self.batch = Batch()
        self.last_of_node: dict[str, EventRow] = {}

    def add(self, data: bytes, subject_node: str | None = None) -> EventRow | None:
        """Apply one event body; the new row, or None for a redelivery.

        Raises `msgspec.DecodeError` / `UnknownEventError` for a body no
        decoder reads, and `ForeignEventError` for an event of another node
        than `subject_node` (the node whose subject it came on): pass them
        to `reject`. A node's events are what it publishes on its own
        subjects, which NATS lets only that node do.
        """
        row = flatten_json(data)
        if subject_node is not None and row.node != subject_node:
            raise ForeignEventError(
                f"an event of node {row.node!r} (seq {row.seq}) on node {subject_node}'s subject"
            )
        fresh, hole = self._accept(row.node, row.seq)
        if not fresh:
            self.batch.duplicates += 1
            return None
        if hole is not None:
            self._gap(row.node, hole)
        if row.type == "PodPending":
            self._waits(data)  # its reasons are not in the row
        self._apply(row)
        if row.type in HEALTH_TYPES:
            self._health(data)
        self.batch.rows.append(row)
        self.last_of_node[row.node] = row
        return row

    def reject(
        self,
        data: bytes,
        error: Exception,
        *,
        key: tuple[str, int] | None,
        subject: str,
        stream_seq: int,
    ) -> None:
        """Keep an undecodable message; `key` (its msg id) marks its (node, seq) applied."""
        if key is not None:
            fresh, hole = self._accept(*key)
            if not fresh:
                self.batch.duplicates += 1
                return
            if hole is not None:
                self._gap(key[0], hole)
        logger.error("undecodable event {} on {}: {}", key, subject, error)
        msg_id = f"{key[0]}:{key[1]}" if key else ""
        self.batch.rejects.append(Reject(stream_seq, subject, msg_id, str(error), data))
        self._ing.stats.undecodable += 1

    def _gap(self, node: str, hole: tuple[int, int]) -> None:
        logger.warning("node {}: events {}..{} are missing (gap in seq)", node, *hole)
        self.batch.gaps.append((node, hole[0], hole[1], self._now))
        self._ing.stats.gaps += 1

    def stored_at(self, node: str, stream_us: int) -> None:
        """When the stream stored `node`'s last event of this batch: its publish lag."""
        row = self.last_of_node[node]
        stats = self._ing.fold.nodes[node]
        stats.last_stream_us = stream_us
        stats.publish_lag_s = max(0.0, (stream_us - row.ts_us) / 1e6)

    def finish(self, position: tuple[str, int] | None = None) -> Batch:
        """The batch to commit: fold changes, and the ranges and open state after it.

        The state is encoded here, so later batches may change the live
        objects while this one commits.
        """
        ing = self._ing
        batch = self.batch
        batch.changes = ing.fold.drain()
        if ing.keeps_state_blob:
            ing.ranges.dirty.clear()
            batch.state = encode_state(ing.ranges, ing.fold)
        else:
            batch.ranges = ing.ranges.take_dirty()
        batch.position = position
        ing.stats.applied += len(batch.rows)
        ing.stats.duplicates += batch.duplicates
        return batch


class ForeignEventError(ValueError):
    """An event whose envelope names another node than the subject it was published on."""


UNREADABLE = (msgspec.DecodeError, UnknownEventError, ForeignEventError)
"""What `BatchBuilder.add` raises for a message to `reject`."""
