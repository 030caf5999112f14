"""The analytics defaults the CLI shows before anything heavy (NATS, the store) is imported."""

from __future__ import annotations

from events.subjects import EVENTS_WILDCARD

EVENT_SUBJECTS = EVENTS_WILDCARD
"""Every node's events: `volfsm.<node>.events.<EventType>`."""

DEFAULT_DURABLE = "volfsm-analytics"
"""The aggregator's durable consumer."""

DEFAULT_LAG_THRESHOLD_S = 300.0
"""A node silent longer than this is lagging."""

DEFAULT_STUCK_THRESHOLD_S = 600.0
"""An entry Uncertain longer than this is stuck."""

DEFAULT_TOP_VOLUMES = 100
"""How many volumes a report lists under time Uncertain, near full and abnormal."""

DEFAULT_NEAR_FULL = 0.9
"""Used share from which a report lists a volume as near full (as `NEAR_FULL`)."""

DEFAULT_PARTITIONS = 1
"""Ingest partitions: one aggregator takes the whole stream."""


def partition_subjects(partition: int | None) -> str:
    """The event subjects of one ingest partition (every event's when None).

    A partitioned stream stores `volfsm.<node>.events.<partition>.<Type>`
    (see `volfsm.analytics.partition`).
    """
    if partition is None:
        return EVENT_SUBJECTS
    return f"volfsm.*.events.{partition}.>"


def partition_durable(durable: str, partition: int | None) -> str:
    """The durable consumer name of one partition's aggregator."""
    return durable if partition is None else f"{durable}-p{partition}"
