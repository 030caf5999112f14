"""The node's durable event log: SQLite (through sqlite-utils), WAL, one writer.

* `append(stream, expected_version, bodies)` is atomic, checks the stream's
  version (optimistic concurrency) and returns only once the events are on
  disk (`synchronous=FULL`).
* One writer thread owns the write connection. Appenders (threads or asyncio
  tasks) hand it requests; it commits everything that queued up while the
  previous commit was syncing in one transaction (group commit), so many
  appenders share one fsync.
* Global `seq` is assigned by the writer: gap-free and in commit order.
* Named cursors live in the same database.
* Only one process may open a log for writing (an flock on `<file>.lock`).
  Files that are not volfsm logs, or come from a newer volfsm, are refused
  before anything is written to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlite_utils

from events.codec import decode_body, encode_body
from events.errors import (
    ConflictError,
    LogClosedError,
    LogLockedError,
    LogMissingError,
    NewerSchemaError,
    NotAVolfsmLogError,
)
from events.types import Body, Envelope

LOG_FORMAT = "volfsm-event-log"
LOG_SCHEMA = 1
ANY_VERSION = -1
"""Pass as `expected_version` to append without a version check."""

Row = tuple[int, str, int, str, int, int, str, bytes]
_COLUMNS = "seq, stream, version, type, schema, ts, node, body"


def row_to_envelope(row: Row) -> Envelope:
    """Decode one stored row into an envelope (upcasting old bodies)."""
    seq, stream, version, type_name, schema, ts, node, body = row
    decoded = decode_body(type_name, schema, body)
    return Envelope(
        seq=seq,
        stream=stream,
        version=version,
        type=type_name,
        schema=type(decoded).SCHEMA,
        ts=ts,
        node=node,
        body=decoded,
    )


def now_us() -> int:
    """UTC wall clock in microseconds since the epoch."""
    return time.time_ns() // 1000


@dataclass
class _Request:
    stream: str
    expected: int
    items: list[tuple[str, int, bytes, Body]]
    sync_future: Future[list[Envelope]] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    async_future: asyncio.Future[list[Envelope]] | None = None
    result: list[Envelope] | BaseException | None = field(default=None)


def _check_existing(path: Path) -> None:
    """Refuse, without writing anything, a file that is not a readable volfsm log."""
    if not path.exists() or path.stat().st_size == 0:
        return
    uri = f"file:{path}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise NotAVolfsmLogError(f"{path}: cannot be opened as SQLite ({exc})") from exc
    try:
        meta = _read_meta(conn, path)
    finally:
        conn.close()
    _check_meta(meta, path)


def _read_meta(conn: sqlite3.Connection, path: Path) -> dict[str, str]:
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise NotAVolfsmLogError(f"{path}: not a volfsm event log ({exc})") from exc
    if "volfsm_meta" not in tables:
        raise NotAVolfsmLogError(f"{path}: not a volfsm event log (no volfsm_meta table)")
    return {k: v for k, v in conn.execute("SELECT key, value FROM volfsm_meta")}


def _check_meta(meta: dict[str, str], path: Path) -> None:
    if meta.get("format") != LOG_FORMAT:
        raise NotAVolfsmLogError(f"{path}: not a volfsm event log (format {meta.get('format')!r})")
    schema = int(meta.get("log_schema", "0"))
    if schema > LOG_SCHEMA:
        raise NewerSchemaError(
            f"{path}: written by a newer volfsm (log schema {schema}; this build reads "
            f"up to {LOG_SCHEMA}); upgrade volfsm to read it. The file was not modified."
        )


def _create_schema(db: sqlite_utils.Database, node: str) -> None:
    if "volfsm_meta" not in db.table_names():
        db["volfsm_meta"].create({"key": str, "value": str}, pk="key")
        db["volfsm_meta"].insert_all(
            [
                {"key": "format", "value": LOG_FORMAT},
                {"key": "log_schema", "value": str(LOG_SCHEMA)},
                {"key": "node", "value": node},
                {"key": "created_us", "value": str(now_us())},
            ]
        )
    if "events" not in db.table_names():
        db["events"].create(
            {
                "seq": int,
                "stream": str,
                "version": int,
                "type": str,
                "schema": int,
                "ts": int,
                "node": str,
                "body": bytes,
            },
            pk="seq",
            not_null={"stream", "version", "type", "schema", "ts", "node", "body"},
        )
        db["events"].create_index(["stream", "version"], unique=True)
        db["events"].create_index(["ts"])
    if "cursors" not in db.table_names():
        db["cursors"].create({"name": str, "seq": int, "updated_us": int}, pk="name")


class EventLog:
    """A volfsm event log file, open for writing (one process) or reading."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        node: str = "",
        readonly: bool = False,
        create: bool = True,
        max_batch: int = 4096,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.path = Path(path)
        self._clock = clock or now_us
        self.readonly = readonly
        self.max_batch = max_batch
        self._lock_fd: int | None = None
        self._closed = False
        self._writer_thread: threading.Thread | None = None
        self._pending: deque[_Request | _CursorWrite] = deque()
        self._cond = threading.Condition()
        self._read_lock = threading.Lock()
        if readonly:
            self._reader = self._open_readonly()
            self.node = self._meta_value("node")
            return
        if not self.path.exists() and not create:
            raise LogMissingError(f"{self.path}: no volfsm event log here")
        _check_existing(self.path)
        self._take_lock()
        try:
            self._writer = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False
            )
            self._writer.execute("PRAGMA journal_mode=WAL")
            self._writer.execute("PRAGMA synchronous=FULL")
            db = sqlite_utils.Database(self._writer)
            meta_node = node
            with self._tx():
                _create_schema(db, node)
            meta = _read_meta(self._writer, self.path)
            _check_meta(meta, self.path)
            meta_node = meta.get("node", node)
            self.node = node or meta_node
            self._reader = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False
            )
            self._next_seq = self._query_last_seq(self._writer) + 1
            self._last_ts = self._query_last_ts(self._writer)
            self._versions: dict[str, int] = {}
        except BaseException:
            self._release_lock()
            raise
        self._writer_thread = threading.Thread(
            target=self._write_loop, name=f"volfsm-log-writer:{self.path.name}", daemon=True
        )
        self._writer_thread.start()

    # ------------------------------------------------------------------ open

    def _open_readonly(self) -> sqlite3.Connection:
        if not self.path.exists():
            raise LogMissingError(f"{self.path}: no volfsm event log here")
        if self.path.stat().st_size == 0:
            raise NotAVolfsmLogError(f"{self.path}: empty file, not a volfsm event log")
        try:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            meta = _read_meta(conn, self.path)
        except NotAVolfsmLogError:
            raise
        except sqlite3.OperationalError:
            # A copied log in a read-only directory: WAL needs -shm; read it as immutable.
            conn = sqlite3.connect(
                f"file:{self.path}?immutable=1", uri=True, check_same_thread=False
            )
            meta = _read_meta(conn, self.path)
        _check_meta(meta, self.path)
        return conn

    def _take_lock(self) -> None:
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LogLockedError(
                f"{self.path}: already open for writing by another process (pid {holder}); "
                "only one writer may hold a volfsm log"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _tx(self) -> _Transaction:
        return _Transaction(self._writer)

    def _meta_value(self, key: str) -> str:
        with self._read_lock:
            row = self._reader.execute(
                "SELECT value FROM volfsm_meta WHERE key = ?", (key,)
            ).fetchone()
        return str(row[0]) if row else ""

    @staticmethod
    def _query_last_seq(conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT max(seq) FROM events").fetchone()
        return int(row[0] or 0)

    @staticmethod
    def _query_last_ts(conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT ts FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        return int(row[0]) if row else 0

    # ---------------------------------------------------------------- append

    def _make_request(self, stream: str, expected_version: int, bodies: Sequence[Body]) -> _Request:
        if self.readonly:
            raise LogClosedError(f"{self.path}: opened read-only")
        if not bodies:
            raise ValueError("append needs at least one event")
        items = [(type(b).__name__, type(b).SCHEMA, encode_body(b), b) for b in bodies]
        return _Request(stream=stream, expected=expected_version, items=items)

    def _enqueue(self, req: _Request) -> None:
        with self._cond:
            if self._closed:
                raise LogClosedError(f"{self.path}: log is closed")
            self._pending.append(req)
            self._cond.notify()

    def append(self, stream: str, expected_version: int, bodies: Sequence[Body]) -> list[Envelope]:
        """Append `bodies` to `stream` atomically; durable when it returns.

        `expected_version` is the stream's current version as the caller saw
        it (0 for a new stream, `ANY_VERSION` to skip the check). A stale one
        raises `ConflictError` and nothing is written.
        """
        req = self._make_request(stream, expected_version, bodies)
        req.sync_future = Future()
        self._enqueue(req)
        return req.sync_future.result()

    async def append_async(
        self, stream: str, expected_version: int, bodies: Sequence[Body]
    ) -> list[Envelope]:
        """`append` for asyncio callers: awaits the group commit without blocking the loop."""
        req = self._make_request(stream, expected_version, bodies)
        req.loop = asyncio.get_running_loop()
        req.async_future = req.loop.create_future()
        self._enqueue(req)
        return await req.async_future

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending and self._closed:
                    return
                batch = [
                    self._pending.popleft() for _ in range(min(len(self._pending), self.max_batch))
                ]
            self._commit_batch(batch)
            self._deliver(batch)

    def _stream_version(self, stream: str) -> int:
        v = self._versions.get(stream)
        if v is None:
            row = self._writer.execute(
                "SELECT max(version) FROM events WHERE stream = ?", (stream,)
            ).fetchone()
            v = int(row[0] or 0)
            self._versions[stream] = v
        return v

    def _commit_batch(self, batch: list[_Request | _CursorWrite]) -> None:
        ts = max(self._clock(), self._last_ts)
        cursor_writes = [c for c in batch if isinstance(c, _CursorWrite)]
        seq = self._next_seq
        rows: list[Row] = []
        touched: dict[str, int] = {}
        accepted: list[_Request] = []
        for req in batch:
            if isinstance(req, _CursorWrite):
                continue
            current = touched.get(req.stream)
            if current is None:
                current = self._stream_version(req.stream)
            if req.expected != ANY_VERSION and req.expected != current:
                req.result = ConflictError(req.stream, req.expected, current)
                continue
            envs: list[Envelope] = []
            for type_name, schema, data, body in req.items:
                current += 1
                rows.append((seq, req.stream, current, type_name, schema, ts, self.node, data))
                envs.append(
                    Envelope(
                        seq=seq,
                        stream=req.stream,
                        version=current,
                        type=type_name,
                        schema=schema,
                        ts=ts,
                        node=self.node,
                        body=body,  # type: ignore[arg-type]
                    )
                )
                seq += 1
            touched[req.stream] = current
            req.result = envs
            accepted.append(req)
        if not rows and not cursor_writes:
            return
        try:
            self._writer.execute("BEGIN IMMEDIATE")
            if rows:
                self._writer.executemany(
                    f"INSERT INTO events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows
                )
            for cw in cursor_writes:
                cw.write()
            self._writer.execute("COMMIT")
        except BaseException as exc:  # the disk said no: nothing of this batch is acknowledged
            if self._writer.in_transaction:
                self._writer.execute("ROLLBACK")
            for req in accepted:
                req.result = exc
            for cw in cursor_writes:
                cw.error = exc
            return
        self._next_seq = seq
        self._last_ts = ts
        self._versions.update(touched)

    @staticmethod
    def _deliver(batch: list[_Request | _CursorWrite]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Request]] = {}
        for req in batch:
            if isinstance(req, _CursorWrite):
                if req.error is not None:
                    req.done.set_exception(req.error)
                else:
                    req.done.set_result(None)
            elif req.sync_future is not None:
                if isinstance(req.result, BaseException):
                    req.sync_future.set_exception(req.result)
                else:
                    req.sync_future.set_result(req.result or [])
            elif req.loop is not None:
                by_loop.setdefault(req.loop, []).append(req)
        for loop, reqs in by_loop.items():
            # A closed loop means nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve_async, reqs)

    # ----------------------------------------------------------------- reads

    def last_seq(self) -> int:
        """The highest committed `seq` (0 for an empty log)."""
        with self._read_lock:
            return self._query_last_seq(self._reader)

    def stream_version(self, stream: str) -> int:
        """The committed version of one stream (0 if it has no events)."""
        with self._read_lock:
            row = self._reader.execute(
                "SELECT max(version) FROM events WHERE stream = ?", (stream,)
            ).fetchone()
        return int(row[0] or 0)

    def _iter_rows(
        self, sql: str, params: tuple[Any, ...], after: int = 0, chunk: int = 8192
    ) -> Iterator[Row]:
        last = after
        while True:
            with self._read_lock:
                rows = self._reader.execute(
                    f"{sql} AND seq > ? ORDER BY seq LIMIT ?", (*params, last, chunk)
                ).fetchall()
            yield from rows
            if len(rows) < chunk:
                return
            last = rows[-1][0]

    def rows_after(self, seq: int = 0, until_seq: int | None = None) -> Iterator[Row]:
        """Raw rows with `seq` > `seq` (and <= `until_seq`), in order: for fast folds."""
        upper = until_seq if until_seq is not None else 2**62
        return self._iter_rows(f"SELECT {_COLUMNS} FROM events WHERE seq <= ?", (upper,), seq)

    def read_after(self, seq: int = 0, until_seq: int | None = None) -> Iterator[Envelope]:
        """Every event with `seq` greater than `seq`, in commit order."""
        for row in self.rows_after(seq, until_seq):
            yield row_to_envelope(row)

    def read_stream(self, stream: str, after_version: int = 0) -> list[Envelope]:
        """One stream's events with version greater than `after_version`."""
        with self._read_lock:
            rows = self._reader.execute(
                f"SELECT {_COLUMNS} FROM events WHERE stream = ? AND version > ? ORDER BY version",
                (stream, after_version),
            ).fetchall()
        return [row_to_envelope(r) for r in rows]

    def read_time_range(self, start_us: int, end_us: int) -> Iterator[Envelope]:
        """Events with `start_us` <= ts < `end_us`, in commit order."""
        for row in self._iter_rows(
            f"SELECT {_COLUMNS} FROM events WHERE ts >= ? AND ts < ?", (start_us, end_us)
        ):
            yield row_to_envelope(row)

    def seq_at_time(self, ts_us: int) -> int:
        """The last `seq` committed at or before `ts_us` (0 if none)."""
        with self._read_lock:
            row = self._reader.execute(
                "SELECT max(seq) FROM events WHERE ts <= ?", (ts_us,)
            ).fetchone()
        return int(row[0] or 0)

    def streams(self) -> list[str]:
        """Every stream name in the log."""
        with self._read_lock:
            return [r[0] for r in self._reader.execute("SELECT DISTINCT stream FROM events")]

    # --------------------------------------------------------------- cursors

    def get_cursor(self, name: str) -> int:
        """The `seq` a named consumer has processed up to (0 if never set)."""
        with self._read_lock:
            row = self._reader.execute("SELECT seq FROM cursors WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def set_cursor(self, name: str, seq: int) -> None:
        """Durably record that consumer `name` has processed everything up to `seq`."""
        if self.readonly:
            raise LogClosedError(f"{self.path}: opened read-only")
        done: Future[None] = Future()

        def write() -> None:
            self._writer.execute(
                "INSERT INTO cursors (name, seq, updated_us) VALUES (?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET seq = excluded.seq, "
                "updated_us = excluded.updated_us",
                (name, seq, now_us()),
            )

        with self._cond:
            if self._closed:
                raise LogClosedError(f"{self.path}: log is closed")
            # Cursor writes share the write connection: run them on the writer thread.
            self._pending.append(_CursorWrite(write, done))
            self._cond.notify()
        done.result()

    def cursors(self) -> dict[str, int]:
        """All named cursors."""
        with self._read_lock:
            return {n: s for n, s in self._reader.execute("SELECT name, seq FROM cursors")}

    # ----------------------------------------------------------------- close

    def close(self) -> None:
        """Finish queued appends, stop the writer and release the write lock."""
        if self._closed:
            return
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._writer_thread is not None:
            self._writer_thread.join()
            self._writer.close()
        self._reader.close()
        self._release_lock()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _CursorWrite:
    write: Callable[[], None]
    done: Future[None]
    error: BaseException | None = None


def _resolve_async(reqs: list[_Request]) -> None:
    for req in reqs:
        fut = req.async_future
        if fut is None or fut.done():
            continue
        if isinstance(req.result, BaseException):
            fut.set_exception(req.result)
        else:
            fut.set_result(req.result or [])


class _Transaction:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
