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
