"""Shared helpers for the event-log tests: a fake clock, sample bodies, log invariants."""

from __future__ import annotations

import hashlib
import sqlite3
from collections import defaultdict
from pathlib import Path

from events.types import Body, DeviceAttached, OperationFailed, OperationStarted

T0 = 1_700_000_000_000_000
"""A fixed UTC µs timestamp the fake clocks start at."""


class FakeClock:
    """A settable UTC µs clock for `EventLog(clock=...)`."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, us: int) -> int:
        self.now += us
        return self.now


def attached(volume_id: str, path: str = "/dev/vdb") -> DeviceAttached:
    return DeviceAttached(volume_id=volume_id, plugin="csi", attachable=True, device_path=path)


def started(op_id: str, volume_id: str = "vol-1") -> OperationStarted:
    return OperationStarted(op_id=op_id, operation="mount_device", volume_id=volume_id)


def failed(op_id: str) -> OperationFailed:
    return OperationFailed(
        op_id=op_id, operation="mount_device", code="Internal", message="boom", final=False
    )


def ops(prefix: str, n: int) -> list[Body]:
    return [started(f"{prefix}-{i}") for i in range(n)]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_valid_log(path: Path) -> list[tuple[int, str, int]]:
    """Check a log file's invariants with plain SQLite; returns (seq, stream, version) rows.

    seq is gap-free from 1; per stream the versions are 1..n, unique, and
    increase with seq.
    """
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT seq, stream, version FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1)), "seq has gaps"
    per_stream: dict[str, list[int]] = defaultdict(list)
    for _, stream, version in rows:
        per_stream[stream].append(version)
    for stream, versions in per_stream.items():
        assert versions == list(range(1, len(versions) + 1)), f"{stream}: versions {versions}"
    return rows
