"""The incident's envelopes and names, read once from tests/data/incident.db."""

from __future__ import annotations

from functools import cache

from events.log import EventLog
from events.types import Envelope
from tests.replay.conftest import INCIDENT

WEB_UID = "8c2e5d71-1a4f-4c3b-b6e2-9d0f3a7c5e18"
REPORT_UID = "b41d9e07-6c2a-4f85-8e3d-2a7b1c9f0d64"
BUILDER_UID = "e9a7c3f1-4b6d-4e2a-a5c8-7f1d0b3e6a25"
METRICS_UID = "3f6a1c52-7d0e-4b8a-9c11-5e2d7f4a8b90"
DATA_PV = "pvc-7d1c0e95-3a8f-4b2d-9e64-1f5c8a2b7d03"
TSDB_PV = "pvc-2b7e4f10-9c3d-4a6e-8f21-c5d0a9e7b314"
START_US = 1_714_533_000_000_000  # 2024-05-01T03:10:00Z
S = 1_000_000


def at(seconds: float) -> int:
    """START + `seconds`, in µs."""
    return START_US + round(seconds * S)


@cache
def envelopes() -> tuple[Envelope, ...]:
    """Every event of the incident, in order."""
    with EventLog(INCIDENT, readonly=True) as log:
        return tuple(log.read_after(0))


def until(ts_us: int) -> list[Envelope]:
    """The incident's events stamped at or before `ts_us`."""
    return [e for e in envelopes() if e.ts <= ts_us]
