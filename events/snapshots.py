"""Snapshots of folded state, kept in the log's own database (log schema 3).

A snapshot is an opaque body (the caller encodes it) plus what is needed
to trust it again later:

* `seq`: the last event the state covers, with that event's `ts` and a
  hash of its stored row. A log truncated below `seq`, or restored from
  another node or another time, no longer has that event: the snapshot is
  refused instead of being applied to a log it does not describe.
* `kind` / `format_version` / `fingerprint`: what wrote it. The reader
  decides which it understands.
* `size` and `sha256` of the body.

The body is stored in chunks, each committed in a short transaction of its
own by the log's writer thread between two group commits
(`EventLog.write_derived`), and the header row last: appends wait for one
chunk at most, and a snapshot whose writer died half-way has no header and
is never read (its chunks are removed by the next save). Those
transactions do not fsync on their own: a snapshot lost to a power cut
costs a longer replay, never a wrong state.

`SnapshotStore.load` checks everything except the body's decoding, which
only the caller can do; every refusal is a `SnapshotError` whose message
says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from events.errors import LogClosedError, VolfsmEventsError

SNAPSHOT_TABLES = (
    "CREATE TABLE IF NOT EXISTS snapshots ("
    "id INTEGER PRIMARY KEY, kind TEXT NOT NULL, format_version INTEGER NOT NULL, "
    "fingerprint TEXT NOT NULL, seq INTEGER NOT NULL, event_ts INTEGER NOT NULL, "
    "event_hash BLOB NOT NULL, created_us INTEGER NOT NULL, size INTEGER NOT NULL, "
    "sha256 BLOB NOT NULL, chunks INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS snapshots_kind_seq ON snapshots (kind, seq)",
    "CREATE TABLE IF NOT EXISTS snapshot_chunks ("
    "snapshot_id INTEGER NOT NULL, n INTEGER NOT NULL, data BLOB NOT NULL, "
    "PRIMARY KEY (snapshot_id, n))",
)
"""DDL of the snapshot tables (created by log schema 3, added to older logs on open)."""

CHUNK_BYTES = 1 << 20
"""Body bytes per chunk (one short write transaction each)."""

_HEADER = (
    "SELECT id, kind, format_version, fingerprint, seq, event_ts, event_hash, created_us, "
    "size, sha256, chunks FROM snapshots"
)
_EVENT_ROW = "SELECT seq, stream, version, type, schema, ts, node, body FROM events WHERE seq = ?"
WriteFn = Callable[[Sequence[tuple[str, tuple[Any, ...]]]], None]
"""Commits statements in one transaction (`EventLog.write_derived`)."""


class SnapshotError(VolfsmEventsError):
    """A snapshot that cannot be used (or saved); the message says why."""


@dataclass(frozen=True)
class SnapshotHeader:
    """What is recorded about one stored snapshot."""

    id: int
    kind: str
    format_version: int
    fingerprint: str
    seq: int
    event_ts: int
    event_hash: bytes
    created_us: int
    size: int
    sha256: bytes
    chunks: int

    def describe(self) -> str:
        """`#id (kind v<version> at seq N)` for messages."""
        return f"snapshot #{self.id} ({self.kind} v{self.format_version} at seq {self.seq})"


def event_row_hash(row: tuple[object, ...]) -> bytes:
    """The hash a snapshot records of the event it ends at: every stored column of the row."""
    return hashlib.sha256(msgspec.msgpack.encode(row)).digest()


class SnapshotStore:
    """The snapshot tables of one log file.

    Reads open a short-lived read-only connection each (consistent on their
    own, nothing shared with the log's readers); saves go through the
    log's writer thread (`write`). Thread-safe; one save at a time.
    """

    def __init__(self, path: Path, read_uri: str, *, write: WriteFn | None) -> None:
        self.path = path
        self._read_uri = read_uri
        self._write = write
        self._write_lock = threading.Lock()
        self._closed = False

    # ----------------------------------------------------------------- reads

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self._read_uri, uri=True, check_same_thread=False)
        try:
            conn.execute("BEGIN")  # one read snapshot for everything the caller reads
            yield conn
        finally:
            conn.close()

    @staticmethod
    def _has_tables(conn: sqlite3.Connection) -> bool:
        row = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' "
            "AND name IN ('snapshots', 'snapshot_chunks')"
        ).fetchone()
        return int(row[0]) == 2

    def available(self) -> bool:
        """Whether this log has snapshot tables (log schema 3 or later)."""
        with self._reading() as conn:
            return self._has_tables(conn)

    def headers(self, kind: str) -> list[SnapshotHeader]:
        """The stored snapshots of `kind`, newest (highest seq) first; [] without tables."""
        with self._reading() as conn:
            if not self._has_tables(conn):
                return []
            rows = conn.execute(
                f"{_HEADER} WHERE kind = ? ORDER BY seq DESC, id DESC", (kind,)
            ).fetchall()
        return [SnapshotHeader(*row) for row in rows]

    def load(self, header: SnapshotHeader) -> bytes:
        """The verified body of a snapshot; `SnapshotError` saying why it cannot be trusted.

        Checks, in one read transaction: the event at `seq` still exists and
        has the recorded `ts` and row hash (the log was not truncated below
        the snapshot nor swapped for another node's or an older copy), the
        chunks are all there, and the body has the recorded size and sha256.
        """
        with self._reading() as conn:
            last = int(conn.execute("SELECT max(seq) FROM events").fetchone()[0] or 0)
            if header.seq > last:
                raise SnapshotError(
                    f"{header.describe()}: covers seq {header.seq} but the log ends at "
                    f"seq {last} (truncated log, or a snapshot of another log)"
                )
            row = conn.execute(_EVENT_ROW, (header.seq,)).fetchone()
            if row is None:
                raise SnapshotError(f"{header.describe()}: the log has no event at its seq")
            if int(row[5]) != header.event_ts or event_row_hash(tuple(row)) != header.event_hash:
                raise SnapshotError(
                    f"{header.describe()}: the log's event at seq {header.seq} is not the one "
                    "the snapshot was taken after (log restored from another node or time?)"
                )
            parts = conn.execute(
                "SELECT n, data FROM snapshot_chunks WHERE snapshot_id = ? ORDER BY n",
                (header.id,),
            ).fetchall()
        if [n for n, _ in parts] != list(range(header.chunks)):
            raise SnapshotError(
                f"{header.describe()}: {len(parts)} of its {header.chunks} chunks are stored"
            )
        body = b"".join(bytes(data) for _, data in parts)
        if len(body) != header.size:
            raise SnapshotError(
                f"{header.describe()}: body is {len(body)} bytes, {header.size} bytes recorded"
            )
        if hashlib.sha256(body).digest() != header.sha256:
            raise SnapshotError(f"{header.describe()}: body checksum (sha256) mismatch")
        return body

    # ---------------------------------------------------------------- writes

    def _writer(self) -> WriteFn:
        if self._closed:
            raise LogClosedError(f"{self.path}: log is closed")
        if self._write is None:
            raise LogClosedError(f"{self.path}: opened read-only")
        return self._write

    def save(
        self,
        *,
        kind: str,
        format_version: int,
        fingerprint: str,
        seq: int,
        body: bytes,
        keep: int,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> SnapshotHeader:
        """Store a snapshot of the state after event `seq`; keep the `keep` newest of `kind`.

        Blocking (call it off the event loop). The log's writer waits for
        one chunk's transaction at most.
        """
        if seq <= 0:
            raise SnapshotError("a snapshot must cover at least one event")
        chunk_bytes = max(1, chunk_bytes)
        with self._write_lock:
            write = self._writer()
            with self._reading() as conn:
                row = conn.execute(_EVENT_ROW, (seq,)).fetchone()
                if row is None:
                    raise SnapshotError(
                        f"cannot snapshot at seq {seq}: no such event in {self.path}"
                    )
                snap_id = 1 + int(
                    conn.execute(
                        "SELECT max(m) FROM (SELECT max(id) AS m FROM snapshots "
                        "UNION ALL SELECT max(snapshot_id) FROM snapshot_chunks)"
                    ).fetchone()[0]
                    or 0
                )
            chunks = [body[i : i + chunk_bytes] for i in range(0, len(body), chunk_bytes)]
            for n, data in enumerate(chunks):
                write(
                    [
                        (
                            "INSERT INTO snapshot_chunks (snapshot_id, n, data) VALUES (?, ?, ?)",
                            (snap_id, n, data),
                        )
                    ]
                )
            header = SnapshotHeader(
                id=snap_id,
                kind=kind,
                format_version=format_version,
                fingerprint=fingerprint,
                seq=seq,
                event_ts=int(row[5]),
                event_hash=event_row_hash(tuple(row)),
                created_us=time.time_ns() // 1000,
                size=len(body),
                sha256=hashlib.sha256(body).digest(),
                chunks=len(chunks),
            )
            write(
                [
                    (
                        "INSERT INTO snapshots (id, kind, format_version, fingerprint, seq, "
                        "event_ts, event_hash, created_us, size, sha256, chunks) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            header.id,
                            header.kind,
                            header.format_version,
                            header.fingerprint,
                            header.seq,
                            header.event_ts,
                            header.event_hash,
                            header.created_us,
                            header.size,
                            header.sha256,
                            header.chunks,
                        ),
                    ),
                    *_prune(kind, keep),
                ]
            )
            return header

    def delete_all(self, kind: str | None = None) -> None:
        """Remove every snapshot (of `kind`)."""
        with self._write_lock:
            where, params = ("", ()) if kind is None else (" WHERE kind = ?", (kind,))
            self._writer()(
                [
                    (f"DELETE FROM snapshots{where}", params),
                    (
                        "DELETE FROM snapshot_chunks WHERE snapshot_id NOT IN "
                        "(SELECT id FROM snapshots)",
                        (),
                    ),
                ]
            )

    def close(self) -> None:
        """No more saves (waits for a save in progress)."""
        with self._write_lock:
            self._closed = True


def _prune(kind: str, keep: int) -> list[tuple[str, tuple[Any, ...]]]:
    """Drop all but the `keep` newest of `kind`, and chunks no header owns (dead writers)."""
    return [
        (
            "DELETE FROM snapshots WHERE kind = ? AND id NOT IN "
            "(SELECT id FROM snapshots WHERE kind = ? ORDER BY seq DESC, id DESC LIMIT ?)",
            (kind, kind, max(1, keep)),
        ),
        ("DELETE FROM snapshot_chunks WHERE snapshot_id NOT IN (SELECT id FROM snapshots)", ()),
    ]
