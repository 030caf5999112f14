"""Ingest partitions: the event stream's subject transform, and which node lands where.

A fleet that outgrows one aggregator splits the stream by node. The
stream gets a subject transform (JetStream 2.10+, part of the stream's own
config) that puts a partition number into each stored subject::

    volfsm.<node>.events.<Type>  ->  volfsm.<node>.events.<P>.<Type>

with P = `{{partition(N,1)}}`, the FNV-1a hash of the node name modulo N
(`node_partition`). Aggregator P consumes `volfsm.*.events.P.>` with a
durable of its own and owns those nodes' rows, each node's events in one
partition only. Publishers and live subscribers are unaffected: the
transform applies to what the stream stores, and the per-node filter
`volfsm.<node>.events.>` still matches.

N is fixed once events are stored partitioned: a different N would move
nodes between aggregators. Messages stored before the transform keep
their subject and reach only an unpartitioned aggregator, so
`set_stream_partitions` refuses a stream that already holds messages
unless told otherwise.
"""

from __future__ import annotations

import dataclasses
import re

from nats.js import JetStreamContext
from nats.js.api import StreamConfig, SubjectTransform

from events.subjects import EVENTS_WILDCARD

_PARTITION_DEST = re.compile(
    r"^volfsm\.\{\{wildcard\(1\)\}\}\.events\.\{\{partition\((\d+),1\)\}\}\.>$"
)


class PartitionError(Exception):
    """The stream is not partitioned as the aggregator expects (or cannot be)."""


def partition_transform(partitions: int) -> SubjectTransform:
    """The stream subject transform that adds the partition token."""
    return SubjectTransform(
        src=EVENTS_WILDCARD,
        dest=f"volfsm.{{{{wildcard(1)}}}}.events.{{{{partition({partitions},1)}}}}.>",
    )


def node_partition(node: str, partitions: int) -> int:
    """The partition JetStream puts `node`'s events in (FNV-1a 32 of the name, modulo N)."""
    h = 0x811C9DC5
    for byte in node.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def stream_partitions(config: StreamConfig) -> int | None:
    """How many partitions the stream's transform makes (None: not partitioned)."""
    transform = config.subject_transform
    if transform is None or transform.src != EVENTS_WILDCARD:
        return None
    match = _PARTITION_DEST.match(transform.dest.replace(" ", ""))
    return int(match.group(1)) if match else None


async def check_partitioned(js: JetStreamContext, stream: str, partitions: int) -> None:
    """Raise `PartitionError` unless `stream` stores events in `partitions` partitions."""
    info = await js.stream_info(stream)
    found = stream_partitions(info.config)
    if found != partitions:
        have = "is not partitioned" if found is None else f"has {found} partitions"
        raise PartitionError(
            f"stream {stream} {have}, the store {partitions}: set them with "
            f"`volfsm analytics partition --partitions {partitions}`"
        )


async def set_stream_partitions(
    js: JetStreamContext, stream: str, partitions: int, *, force: bool = False
) -> StreamConfig:
    """Give `stream` the transform for `partitions` partitions; its new config.

    Refused when the stream already holds messages (they would keep their
    unpartitioned subjects) unless `force`.
    """
    if partitions < 1:
        raise PartitionError("at least one partition")
    info = await js.stream_info(stream)
    if stream_partitions(info.config) == partitions:
        return info.config
    held = info.state.messages
    if held and not force:
        raise PartitionError(
            f"stream {stream} holds {held} messages stored unpartitioned; partitioned "
            "aggregators would never read them (use --force to partition what comes next)"
        )
    config = dataclasses.replace(info.config, subject_transform=partition_transform(partitions))
    updated = await js.update_stream(config)
    return updated.config
