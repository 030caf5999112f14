"""The node's durable event log: SQLite (through sqlite-utils), WAL, one writer.

* `append(stream, expected_version, bodies)` is atomic, checks the stream's
  version (optimistic concurrency) and returns only once the events are on
  disk (WAL with `synchronous=FULL`: the commit fsyncs the WAL).
* One writer thread owns the write connection. Appenders (threads or asyncio
  tasks) hand it requests; it commits everything that queued up while the
  previous commit was syncing in one transaction (group commit), so many
  appenders share one fsync.
* Global `seq` is assigned by the writer: gap-free and in commit order.
* Per-stream lookups go through `stream_index` ((stream, version) -> seq).
  It is derived data, kept off the durable append path: the writer fills it
  from the events in larger, later transactions (when idle, or every few
  thousand events) and on open (crash recovery). `index_state.indexed_seq`
  says how far it goes; stream reads add the unindexed tail (seq above it,
  a short rowid range) to what the index finds, in one SQL statement.
  A group commit thus dirties only append-only pages (the events table and
  its `ts` index) instead of one index page per stream it touches.
* Named cursors live in the same database, and so do snapshots of folded
  state (`snapshots`, see `events.snapshots`; log schema 3 added their
  tables, and opening an older log for writing adds them).
* Only one process may open a log for writing (an flock on `<file>.lock`).
  Files that are not volfsm logs, or come from a newer volfsm, are refused
  before anything is written to them (and before the lock file is created).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlite_utils

from events.codec import (
    CURRENT_SCHEMAS,
    TYPE_INFO,
    body_type_info,
    decode_body,
    decode_current_body,
    encode_body,
)
from events.errors import (
    ConflictError,
    LogClosedError,
    LogLockedError,
    LogMissingError,
    LogOpenError,
    NewerSchemaError,
    NotAVolfsmLogError,
    RestoreError,
)
from events.foldrows import FoldRows, legacy_column
from events.snapshots import SNAPSHOT_TABLES, SnapshotStore
from events.types import Body, Envelope

LOG_FORMAT = "volfsm-event-log"
LOG_SCHEMA = 3
"""2: stream_index + index_state replace schema 1's unique (stream, version) index on events.
3: the snapshots and snapshot_chunks tables (`events.snapshots`); additive."""
ANY_VERSION = -1
"""Pass as `expected_version` to append without a version check."""
LOG_ID_KEY = "log_id"
"""`volfsm_meta` key of the log's identity: a random id written when the log is created
(logs from before it get one the first time they are opened for writing). A copy of the
file keeps it; a new log has another. Additive: no schema change, older builds ignore it."""

Row = tuple[int, str, int, str, int, int, str, bytes]
_COLUMNS = "seq, stream, version, type, schema, ts, node, body"
_INSERT = f"INSERT INTO events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_UPSERT_CURSOR = (
    "INSERT INTO cursors (name, seq, updated_us) VALUES (?, ?, ?) "
    "ON CONFLICT(name) DO UPDATE SET seq = excluded.seq, updated_us = excluded.updated_us"
)
_SQLITE_MAGIC = b"SQLite format 3\x00"
_INDEX_FLUSH_EVENTS = 16384
"""Index the tail once it is this long, even if the writer is never idle."""
_INDEX_IDLE_S = 0.02
"""Index the tail after the writer has been idle this long."""
_TAIL = "seq > (SELECT indexed_seq FROM index_state)"
_STREAM_ROWS = (
    f"SELECT e.seq, e.stream, e.version, e.type, e.schema, e.ts, e.node, e.body "
    "FROM stream_index i JOIN events e ON e.seq = i.seq "
    "WHERE i.stream = :stream AND i.version > :after "
    f"UNION ALL SELECT {_COLUMNS} FROM events "
    f"WHERE {_TAIL} AND stream = :stream AND version > :after "
    "ORDER BY 3"
)
_STREAM_VERSION = (
    "SELECT max(v) FROM ("
    "SELECT max(version) AS v FROM stream_index WHERE stream = :stream "
    f"UNION ALL SELECT max(version) FROM events WHERE {_TAIL} AND stream = :stream)"
)
_STREAMS = (
    f"SELECT stream FROM stream_index UNION SELECT stream FROM events WHERE {_TAIL} ORDER BY 1"
)
_HAS_STREAM_IN = (
    "SELECT 1 FROM stream_index WHERE stream >= :lo AND stream < :hi "
    f"UNION ALL SELECT 1 FROM events WHERE {_TAIL} AND stream >= :lo AND stream < :hi LIMIT 1"
)
_INDEX_TAIL = (
    "INSERT INTO stream_index (stream, version, seq) "
    "SELECT stream, version, seq FROM events WHERE seq > ? AND seq <= ? ORDER BY stream, version"
)
_READ_CHUNK = 16384
"""Rows fetched per query by the scanning reads (a short read lock per chunk)."""
_WAL_AUTOCHECKPOINT_PAGES = 8192
"""Checkpoint the WAL every ~32 MiB instead of SQLite's ~4 MiB: successive
commits keep rewriting the same hot pages (the last pages of the events table
and its ts index, the stream_index pages of busy streams); fewer, larger
checkpoints copy each of them to the database once instead of many times."""
_WAL_SIZE_LIMIT_BYTES = 64 << 20
"""After a checkpoint, a WAL that grew past this (a long reader held it) is truncated."""


_LEGACY = legacy_column(CURRENT_SCHEMAS)
"""`scan_fold`'s last column: NULL, or "type:schema" for a row to upcast."""


def _scan_filter(
    after: int,
    until_seq: int | None,
    prefix: str,
    other_streams: bool,
    also_types: Sequence[str],
) -> tuple[str, list[Any]]:
    """The WHERE clause and its parameters of `scan_rows` / `scan_fold`."""
    upper = until_seq if until_seq is not None else 2**62
    where = "WHERE seq > ? AND seq <= ?"
    params: list[Any] = [after, upper]
    if prefix:
        cond = "(stream >= ? AND stream < ?)"
        params += [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]
        if other_streams:
            cond = f"NOT {cond}"
        if also_types:
            cond = f"({cond} OR type IN ({', '.join('?' * len(also_types))}))"
            params += list(also_types)
        where += f" AND {cond}"
    return where, params


def row_to_envelope(row: Row) -> Envelope:
    """Decode one stored row into an envelope (upcasting old bodies)."""
    seq, stream, version, type_name, schema, ts, node, data = row
    body = decode_body(type_name, schema, data)
    return Envelope(
        seq=seq,
        stream=stream,
        version=version,
        type=type_name,
        schema=type(body).SCHEMA,
        ts=ts,
        node=node,
        body=body,
    )


def now_us() -> int:
    """UTC wall clock in microseconds since the epoch."""
    return time.time_ns() // 1000


# --------------------------------------------------------------------- work items


class _Work:
    """A unit of work for the writer thread and the way its submitter waits.

    A thread waits on `lock` (acquired before submitting, released by the
    writer); an asyncio task awaits `future`, resolved on its own `loop`.
    The writer leaves the outcome in `result`.
    """

    __slots__ = ("future", "lock", "loop", "result")

    lock: Any
    loop: asyncio.AbstractEventLoop | None
    future: asyncio.Future[None] | None
    result: Any


def _thread_waiter() -> Any:
    lock = threading.Lock()
    lock.acquire()
    return lock


class _Append(_Work):
    """An append request; the writer fills `first_seq`, `first_version` and `ts`."""

    __slots__ = ("bodies", "datas", "expected", "first_seq", "first_version", "stream", "ts")

    def __init__(
        self,
        stream: str,
        expected: int,
        bodies: Sequence[Body],
        datas: list[bytes],
        lock: Any,
        loop: asyncio.AbstractEventLoop | None,
        future: asyncio.Future[None] | None,
    ) -> None:
        self.stream = stream
        self.expected = expected
        self.bodies = bodies
        self.datas = datas
        self.lock = lock
        self.loop = loop
        self.future = future
        self.result = None
        self.first_seq = 0
        self.first_version = 0
        self.ts = 0


class _CursorWrite(_Work):
    __slots__ = ("name", "seq")

    def __init__(self, name: str, seq: int) -> None:
        self.name = name
        self.seq = seq
        self.lock = _thread_waiter()
        self.loop = None
        self.future = None
        self.result = None


class _SqlWrite(_Work):
    """Statements committed in a transaction of their own (`write_derived`, `restore`).

    `events`: the statements add events (`restore`): the commit is synced
    like an append's and the writer re-reads where the log ends after it.
    """

    __slots__ = ("events", "statements")

    def __init__(self, statements: list[tuple[str, tuple[Any, ...]]], events: bool = False) -> None:
        self.statements = statements
        self.events = events
        self.lock = _thread_waiter()
        self.loop = None
        self.future = None
        self.result = None


def _resolve_async(works: list[_Work]) -> None:
    for work in works:
        fut = work.future
        if fut is None or fut.done():
            continue
        if isinstance(work.result, BaseException):
            fut.set_exception(work.result)
        else:
            fut.set_result(None)


# ------------------------------------------------------------------- checks


def _sniff(path: Path) -> None:
    """Refuse a non-empty file that does not even start like an SQLite database."""
    with path.open("rb") as f:
        head = f.read(len(_SQLITE_MAGIC))
    if head and head != _SQLITE_MAGIC:
        raise NotAVolfsmLogError(f"{path}: not a volfsm event log (not an SQLite database)")


def _probe_uri(path: Path) -> str:
    """A read-only URI that creates nothing beside the file.

    Without a `-wal` file the database is entirely in the main file and can
    be read as immutable (no `-shm`/`-wal` created); with one, the WAL must
    be read too.
    """
    if Path(f"{path}-wal").exists():
        return f"file:{path}?mode=ro"
    return f"file:{path}?immutable=1"


def _check_existing(path: Path) -> None:
    """Refuse, without writing anything, a file that is not a readable volfsm log."""
    if not path.exists() or path.stat().st_size == 0:
        return
    _sniff(path)
    try:
        conn = sqlite3.connect(_probe_uri(path), uri=True)
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
        if "volfsm_meta" not in tables:
            raise NotAVolfsmLogError(f"{path}: not a volfsm event log (no volfsm_meta table)")
        return {str(k): str(v) for k, v in conn.execute("SELECT key, value FROM volfsm_meta")}
    except sqlite3.DatabaseError as exc:
        raise NotAVolfsmLogError(f"{path}: not a volfsm event log ({exc})") from exc


def _check_meta(meta: dict[str, str], path: Path) -> int:
    """The log schema of a readable volfsm log; raises for anything else."""
    if meta.get("format") != LOG_FORMAT:
        raise NotAVolfsmLogError(f"{path}: not a volfsm event log (format {meta.get('format')!r})")
    try:
        schema = int(meta.get("log_schema", "0"))
    except ValueError:
        raise NotAVolfsmLogError(
            f"{path}: not a volfsm event log (log_schema {meta.get('log_schema')!r})"
        ) from None
    if schema > LOG_SCHEMA:
        raise NewerSchemaError(
            f"{path}: written by a newer volfsm (log schema {schema}; this build reads "
            f"up to {LOG_SCHEMA}); upgrade volfsm to read it. The file was not modified."
        )
    return schema


def new_log_id() -> str:
    """A fresh log identity (a random UUID)."""
    return str(uuid.uuid4())


def _ensure_log_id(conn: sqlite3.Connection) -> None:
    """Give a log written before log ids existed its id (in the caller's transaction)."""
    conn.execute(
        "INSERT OR IGNORE INTO volfsm_meta (key, value) VALUES (?, ?)", (LOG_ID_KEY, new_log_id())
    )


def _create_schema(db: sqlite_utils.Database, node: str, created_us: int) -> None:
    if "volfsm_meta" not in db.table_names():
        db["volfsm_meta"].create({"key": str, "value": str}, pk="key")
        db["volfsm_meta"].insert_all(
            [
                {"key": "format", "value": LOG_FORMAT},
                {"key": "log_schema", "value": str(LOG_SCHEMA)},
                {"key": "node", "value": node},
                {"key": "created_us", "value": str(created_us)},
                {"key": LOG_ID_KEY, "value": new_log_id()},
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
        db["events"].create_index(["ts"])
    _create_stream_index(db)
    if "cursors" not in db.table_names():
        db["cursors"].create({"name": str, "seq": int, "updated_us": int}, pk="name")
    _create_snapshot_tables(db)


def _create_snapshot_tables(db: sqlite_utils.Database) -> None:
    for ddl in SNAPSHOT_TABLES:
        db.execute(ddl)


def _create_stream_index(db: sqlite_utils.Database) -> None:
    if "stream_index" not in db.table_names():
        db.execute(
            "CREATE TABLE stream_index (stream TEXT NOT NULL, version INTEGER NOT NULL, "
            "seq INTEGER NOT NULL, PRIMARY KEY (stream, version)) WITHOUT ROWID"
        )
    if "index_state" not in db.table_names():
        db["index_state"].create({"id": int, "indexed_seq": int}, pk="id")
        db["index_state"].insert({"id": 0, "indexed_seq": 0})


def _upgrade_schema(db: sqlite_utils.Database, schema: int) -> None:
    """Bring a log of an older schema to `LOG_SCHEMA` (in the caller's transaction).

    1 -> 2: schema 1 kept a unique (stream, version) index on events; it
    moves to stream_index. 2 -> 3: the snapshot tables are added.
    """
    if schema < 2:
        _create_stream_index(db)
        db.execute("DROP INDEX IF EXISTS idx_events_stream_version")
    if schema < 3:
        _create_snapshot_tables(db)
    db.execute("UPDATE volfsm_meta SET value = ? WHERE key = 'log_schema'", (str(LOG_SCHEMA),))


def _shim_schema_1(conn: sqlite3.Connection) -> None:
    """Let a read-only connection to a schema-1 log use the schema-2 queries.

    An empty TEMP stream_index and indexed_seq 0 make every stream read a
    "tail" read, which schema 1's (stream, version) index on events serves.
    Nothing is written to the log file.
    """
    conn.execute(
        "CREATE TEMP TABLE stream_index (stream TEXT NOT NULL, version INTEGER NOT NULL, "
        "seq INTEGER NOT NULL, PRIMARY KEY (stream, version)) WITHOUT ROWID"
    )
    conn.execute("CREATE TEMP TABLE index_state (id INTEGER PRIMARY KEY, indexed_seq INTEGER)")
    conn.execute("INSERT INTO temp.index_state VALUES (0, 0)")


# ---------------------------------------------------------------------- the log


class EventLog:
    """A volfsm event log file, open for writing (one process) or reading."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        node: str = "",
        readonly: bool = False,
        create: bool = True,
        max_batch: int = 16384,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.path = Path(path)
        self._clock = clock or now_us
        self.readonly = readonly
        self.max_batch = max(1, max_batch)
        """Most events committed in one transaction."""
        self.log_id = ""
        """The log's identity (`LOG_ID_KEY`); "" only for an old log opened read-only."""
        self._lock_fd: int | None = None
        self._closed = False
        self._writer_thread: threading.Thread | None = None
        self._pending: list[_Work] = []
        self._writer_idle = False
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._read_lock = threading.Lock()
        self._read_uri = f"file:{self.path}?mode=ro"
        self._snapshots: SnapshotStore | None = None
        if readonly:
            self._reader = self._open_readonly()
            self.node = self._meta_value("node")
            self.log_id = self._meta_value(LOG_ID_KEY)
            return
        if not self.path.exists() and not create:
            raise LogMissingError(f"{self.path}: no volfsm event log here")
        if not self.path.parent.is_dir():
            raise LogOpenError(f"{self.path}: directory {self.path.parent} does not exist")
        _check_existing(self.path)
        self._take_lock()
        try:
            # Checked again under the lock: the file may have changed meanwhile.
            _check_existing(self.path)
            self._writer = self._open_writer(node)
            meta = _read_meta(self._writer, self.path)
            _check_meta(meta, self.path)
            self.node = node or meta.get("node", "")
            self.log_id = meta.get(LOG_ID_KEY, "")
            self._next_seq = self._query_last_seq(self._writer) + 1
            self._last_ts = self._query_last_ts(self._writer)
            self._indexed_seq = int(
                self._writer.execute("SELECT indexed_seq FROM index_state").fetchone()[0]
            )
            # Versions of the streams written since open. Every stream with
            # events above indexed_seq is in here, so a miss may ask the index.
            self._versions: dict[str, int] = {}
            try:
                self._index_tail()  # what a crashed writer left unindexed
            except sqlite3.Error as exc:
                raise LogOpenError(f"{self.path}: cannot index the log's events ({exc})") from exc
            self._reader = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False
            )
        except BaseException:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._release_lock()
            raise
        self._writer_thread = threading.Thread(
            target=self._write_loop, name=f"volfsm-log-writer:{self.path.name}", daemon=True
        )
        self._writer_thread.start()

    # ------------------------------------------------------------------ open

    def _open_writer(self, node: str) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_AUTOCHECKPOINT_PAGES}")
        conn.execute(f"PRAGMA journal_size_limit={_WAL_SIZE_LIMIT_BYTES}")
        import sqlite_utils  # only writers create or upgrade tables: readers start faster

        db = sqlite_utils.Database(conn)
        with _Transaction(conn):
            if "volfsm_meta" not in db.table_names():
                _create_schema(db, node, self._clock())
            else:
                meta = _read_meta(conn, self.path)
                schema = _check_meta(meta, self.path)
                if schema < LOG_SCHEMA:
                    _upgrade_schema(db, schema)
                if LOG_ID_KEY not in meta:
                    _ensure_log_id(conn)
        return conn

    def _open_readonly(self) -> sqlite3.Connection:
        if not self.path.exists():
            raise LogMissingError(f"{self.path}: no volfsm event log here")
        if self.path.stat().st_size == 0:
            raise NotAVolfsmLogError(f"{self.path}: empty file, not a volfsm event log")
        _check_existing(self.path)  # refuses foreign files before SQLite may add -wal/-shm
        try:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            meta = _read_meta(conn, self.path)
        except NotAVolfsmLogError:
            raise
        except sqlite3.OperationalError:
            # A copied log in a read-only directory: WAL needs -shm; read it as immutable.
            self._read_uri = f"file:{self.path}?immutable=1"
            conn = sqlite3.connect(self._read_uri, uri=True, check_same_thread=False)
            meta = _read_meta(conn, self.path)
        if _check_meta(meta, self.path) < 2:
            _shim_schema_1(conn)
        return conn

    def _take_lock(self) -> None:
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            who = (
                f"this process (pid {holder}) through another EventLog"
                if holder == str(os.getpid())
                else f"another process (pid {holder})"
            )
            raise LogLockedError(
                f"{self.path}: already open for writing by {who}; "
                "only one writer may hold a volfsm log"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

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

    def _encode(self, stream: str, expected_version: int, bodies: Sequence[Body]) -> list[bytes]:
        if self.readonly:
            raise LogClosedError(f"{self.path}: opened read-only")
        if not bodies:
            raise ValueError("append needs at least one event")
        if not stream:
            raise ValueError("append needs a stream name")
        if expected_version < ANY_VERSION:
            raise ValueError(f"expected_version {expected_version} is not a version")
        for body in bodies:
            if type(body) not in TYPE_INFO:
                body_type_info(body)  # raises the TypeError that explains it
        return [encode_body(body) for body in bodies]

    def _submit(self, work: _Work) -> None:
        with self._lock:
            if self._closed:
                raise LogClosedError(f"{self.path}: log is closed")
            self._pending.append(work)
            if self._writer_idle:
                self._writer_idle = False
                self._cond.notify()

    def _envelopes(self, req: _Append) -> list[Envelope]:
        if req.result is not None:
            raise req.result
        seq = req.first_seq
        version = req.first_version
        stream = req.stream
        ts = req.ts
        node = self.node
        out = []
        for body in req.bodies:
            type_name, schema = TYPE_INFO[type(body)]
            out.append(
                Envelope(
                    seq=seq,
                    stream=stream,
                    version=version,
                    type=type_name,
                    schema=schema,
                    ts=ts,
                    node=node,
                    body=body,  # type: ignore[arg-type]
                )
            )
            seq += 1
            version += 1
        return out

    def append(self, stream: str, expected_version: int, bodies: Sequence[Body]) -> list[Envelope]:
        """Append `bodies` to `stream` atomically; durable when it returns.

        `expected_version` is the stream's current version as the caller saw
        it (0 for a new stream, `ANY_VERSION` to skip the check). A stale one
        raises `ConflictError` and nothing is written.
        """
        datas = self._encode(stream, expected_version, bodies)
        waiter = _thread_waiter()
        req = _Append(stream, expected_version, bodies, datas, waiter, None, None)
        self._submit(req)
        waiter.acquire()
        return self._envelopes(req)

    async def append_async(
        self, stream: str, expected_version: int, bodies: Sequence[Body]
    ) -> list[Envelope]:
        """`append` for asyncio callers: awaits the group commit without blocking the loop."""
        datas = self._encode(stream, expected_version, bodies)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        req = _Append(stream, expected_version, bodies, datas, None, loop, fut)
        self._submit(req)
        await fut
        return self._envelopes(req)

    # ---------------------------------------------------------------- writer

    def _take_batch(self) -> list[_Work] | None:
        """Wait for work: a batch; [] when idle long enough to index; None when closed."""
        with self._cond:
            while not self._pending:
                if self._closed:
                    return None
                self._writer_idle = True
                if self._next_seq - 1 > self._indexed_seq:
                    if not self._cond.wait(_INDEX_IDLE_S) and not self._pending:
                        self._writer_idle = False
                        return []
                else:
                    self._cond.wait()
            self._writer_idle = False
            batch = self._pending
            events = 0
            for i, work in enumerate(batch):
                if isinstance(work, _Append):
                    events += len(work.datas)
                    if events > self.max_batch and i > 0:
                        self._pending = batch[i:]
                        return batch[:i]
            self._pending = []
            return batch

    def _write_loop(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                break
            if batch:
                writes = [w for w in batch if isinstance(w, _SqlWrite)]
                if writes:
                    batch = [w for w in batch if not isinstance(w, _SqlWrite)]
                if batch:
                    try:
                        self._commit_batch(batch)
                    except BaseException as exc:  # never leave a submitter waiting
                        for work in batch:
                            if not isinstance(work.result, BaseException):
                                work.result = exc
                    self._deliver(batch)
                for write in writes:  # after the appends were answered
                    self._commit_write(write)
                    self._deliver([write])
            unindexed = self._next_seq - 1 - self._indexed_seq
            if unindexed >= (_INDEX_FLUSH_EVENTS if batch else 1):
                self._try_index_tail()
        self._try_index_tail()

    def _commit_write(self, work: _SqlWrite) -> None:
        """Commit derived data in a transaction of its own, without an fsync of its own.

        `synchronous=NORMAL` for it: the next append's commit syncs the WAL
        with it; a power cut may lose it, which costs a longer replay, never
        a wrong state (it is derived from events committed before it).
        """
        writer = self._writer
        try:
            if not work.events:
                writer.execute("PRAGMA synchronous=NORMAL")
            try:
                writer.execute("BEGIN IMMEDIATE")
                for sql, params in work.statements:
                    writer.execute(sql, params)
                writer.execute("COMMIT")
            finally:
                if writer.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        writer.execute("ROLLBACK")
                writer.execute("PRAGMA synchronous=FULL")
        except BaseException as exc:
            work.result = exc
        if work.events:
            self._resync()

    def write_derived(self, statements: Sequence[tuple[str, tuple[Any, ...]]]) -> None:
        """Commit `statements` (derived data kept in the log file: snapshots) on the writer.

        They run in a transaction of their own between two group commits:
        appends never share a transaction with them (their failure fails no
        append) and wait for one such transaction at most, with no lock
        contention between two SQLite connections (whose busy handler
        sleeps in steps of up to 100 ms). Blocking; raises what SQLite raised.
        """
        if self.readonly:
            raise LogClosedError(f"{self.path}: opened read-only")
        work = _SqlWrite(list(statements))
        self._submit(work)
        work.lock.acquire()
        if isinstance(work.result, BaseException):
            raise work.result

    def restore(self, envelopes: Sequence[Envelope]) -> int:
        """Put back events this node recorded before (e.g. copies from JetStream) as they were.

        For a log that lost its tail (deleted, or restored from an older
        backup). Each event keeps its seq, stream version and ts, and must
        continue the log: seq `last_seq() + 1`, `+ 2`, ... in order, the next
        version of its stream, this log's node, a ts not before the last.
        `RestoreError` names the first that does not, and nothing of the call
        is written. Bodies are stored in their current schema. Meant for a
        log nothing else appends to (the service is not running). Durable
        when it returns; returns how many events were added.
        """
        if self.readonly:
            raise LogClosedError(f"{self.path}: opened read-only")
        seq = self.last_seq() + 1
        last_ts = self._last_ts
        versions: dict[str, int] = {}
        statements: list[tuple[str, tuple[Any, ...]]] = []
        for env in envelopes:
            where = f"event seq {env.seq} ({env.type} on {env.stream})"
            if env.seq != seq:
                raise RestoreError(f"{where} does not continue the log: the next seq is {seq}")
            if env.node != self.node:
                raise RestoreError(f"{where} is of node {env.node!r}, not of {self.node!r}")
            version = versions.get(env.stream)
            if version is None:
                version = self.stream_version(env.stream)
            if env.version != version + 1:
                raise RestoreError(
                    f"{where} has version {env.version}; the stream is at version {version}"
                )
            if env.ts < last_ts:
                raise RestoreError(f"{where} is older ({env.ts}) than the log's last ({last_ts})")
            type_name, schema = body_type_info(env.body)
            row = (env.seq, env.stream, env.version, type_name, schema, env.ts, env.node)
            statements.append((_INSERT, (*row, encode_body(env.body))))
            versions[env.stream] = env.version
            last_ts = env.ts
            seq += 1
        if not statements:
            return 0
        work = _SqlWrite(statements, events=True)
        self._submit(work)
        work.lock.acquire()
        if isinstance(work.result, BaseException):
            raise work.result
        return len(statements)

    def _index_tail(self) -> None:
        """Add the events above indexed_seq to stream_index, in one transaction."""
        low, high = self._indexed_seq, self._next_seq - 1
        if high <= low:
            return
        writer = self._writer
        writer.execute("BEGIN IMMEDIATE")
        try:
            writer.execute(_INDEX_TAIL, (low, high))
            writer.execute("UPDATE index_state SET indexed_seq = ?", (high,))
            writer.execute("COMMIT")
        except BaseException:
            if writer.in_transaction:
                writer.execute("ROLLBACK")
            raise
        self._indexed_seq = high

    def _try_index_tail(self) -> bool:
        """Index the tail; on failure leave it (stream reads still scan it) and say so."""
        try:
            self._index_tail()
        except sqlite3.Error:
            return False
        return True

    def _stream_version(self, stream: str) -> int:
        """A stream not written since open: the index has all of it."""
        row = self._writer.execute(
            "SELECT max(version) FROM stream_index WHERE stream = ?", (stream,)
        ).fetchone()
        v = int(row[0] or 0)
        self._versions[stream] = v
        return v

    def _resync(self) -> None:
        """After a failed batch: re-read where the log ends and the stream versions.

        A rolled-back batch changed nothing, but whatever made it fail may
        have (someone else wrote to the file): trust the database, not the
        caches. Versions are re-read from the index once it covers the tail.
        """
        with contextlib.suppress(sqlite3.Error):
            self._next_seq = self._query_last_seq(self._writer) + 1
            self._last_ts = max(self._last_ts, self._query_last_ts(self._writer))
            if self._try_index_tail():
                self._versions.clear()

    def _commit_batch(self, batch: list[_Work]) -> None:
        ts = self._clock()
        if ts < self._last_ts:
            ts = self._last_ts  # timestamps never go backwards in a log
        seq = self._next_seq
        node = self.node
        rows: list[Row] = []
        add = rows.append
        touched: dict[str, int] = {}
        versions = self._versions
        type_info = TYPE_INFO
        accepted: list[_Work] = []
        cursor_rows: list[tuple[str, int, int]] = []
        for work in batch:
            if not isinstance(work, _Append):
                assert isinstance(work, _CursorWrite)
                cursor_rows.append((work.name, work.seq, ts))
                accepted.append(work)
                continue
            stream = work.stream
            current = touched.get(stream)
            if current is None:
                current = versions.get(stream)
                if current is None:
                    current = self._stream_version(stream)
            expected = work.expected
            if expected != ANY_VERSION and expected != current:
                work.result = ConflictError(stream, expected, current)
                continue
            work.first_seq = seq
            work.first_version = current + 1
            work.ts = ts
            for body, data in zip(work.bodies, work.datas, strict=True):
                type_name, schema = type_info[type(body)]
                current += 1
                add((seq, stream, current, type_name, schema, ts, node, data))
                seq += 1
            touched[stream] = current
            accepted.append(work)
        if not accepted:
            return
        writer = self._writer
        try:
            writer.execute("BEGIN IMMEDIATE")
            if rows:
                writer.executemany(_INSERT, rows)
            if cursor_rows:
                writer.executemany(_UPSERT_CURSOR, cursor_rows)
            writer.execute("COMMIT")
        except BaseException as exc:  # the disk said no: nothing of this batch is acknowledged
            if writer.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    writer.execute("ROLLBACK")
            for work in accepted:
                work.result = exc
            self._resync()
            return
        self._next_seq = seq
        self._last_ts = ts
        versions.update(touched)

    @staticmethod
    def _deliver(batch: list[_Work]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Work]] = {}
        for work in batch:
            if work.lock is not None:
                work.lock.release()
            elif work.loop is not None:
                waiting = by_loop.get(work.loop)
                if waiting is None:
                    by_loop[work.loop] = [work]
                else:
                    waiting.append(work)
        for loop, works in by_loop.items():
            # A closed loop means nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve_async, works)

    # ----------------------------------------------------------------- reads

    def last_seq(self) -> int:
        """The highest committed `seq` (0 for an empty log)."""
        with self._read_lock:
            return self._query_last_seq(self._reader)

    def stream_version(self, stream: str) -> int:
        """The committed version of one stream (0 if it has no events)."""
        with self._read_lock:
            row = self._reader.execute(_STREAM_VERSION, {"stream": stream}).fetchone()
        return int(row[0] or 0)

    def _chunks(self, after: int, until: int | None) -> Iterator[list[Row]]:
        """Rows with `after` < seq <= `until`, a chunk (one short query) at a time."""
        upper = until if until is not None else 2**62
        last = after
        sql = f"SELECT {_COLUMNS} FROM events WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?"
        while last < upper:
            with self._read_lock:
                rows: list[Row] = self._reader.execute(sql, (last, upper, _READ_CHUNK)).fetchall()
            if rows:
                yield rows
            if len(rows) < _READ_CHUNK:
                return
            last = rows[-1][0]

    def rows_after(self, seq: int = 0, until_seq: int | None = None) -> Iterator[Row]:
        """Raw rows with `seq` > `seq` (and <= `until_seq`), in order: for fast folds."""
        for rows in self._chunks(seq, until_seq):
            yield from rows

    def read_after(self, seq: int = 0, until_seq: int | None = None) -> Iterator[Envelope]:
        """Every event with `seq` greater than `seq` (up to `until_seq`), in commit order."""
        for rows in self._chunks(seq, until_seq):
            yield from _decode_rows(rows)

    def replay(
        self,
        apply: Callable[[Envelope], object],
        after: int = 0,
        until_seq: int | None = None,
    ) -> int:
        """Call `apply` with every event after `after` (up to `until_seq`), in order.

        The fast path for folds (recovery, projections): one cursor on a
        connection of its own (one consistent snapshot, no lock shared with
        other readers) and no generator between the rows and `apply`.
        Returns the `seq` of the last event applied (`after` if none).
        """
        upper = until_seq if until_seq is not None else 2**62
        conn = sqlite3.connect(self._read_uri, uri=True, check_same_thread=False)
        try:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM events WHERE seq > ? AND seq <= ? ORDER BY seq",
                (after, upper),
            )
            schemas = CURRENT_SCHEMAS
            decode = decode_current_body
            make = Envelope
            seq = after
            for seq, stream, version, type_name, schema, ts, node, data in rows:
                if schemas.get(type_name) == schema:
                    body = decode(data)
                else:
                    body = decode_body(type_name, schema, data)
                    schema = type(body).SCHEMA
                apply(
                    make(
                        seq=seq,
                        stream=stream,
                        version=version,
                        type=type_name,
                        schema=schema,
                        ts=ts,
                        node=node,
                        body=body,
                    )
                )
            return seq
        finally:
            conn.close()

    @contextlib.contextmanager
    def scan_rows(
        self,
        after: int = 0,
        until_seq: int | None = None,
        *,
        prefix: str = "",
        other_streams: bool = False,
        also_types: Sequence[str] = (),
    ) -> Iterator[Iterator[tuple[int, str, int, str, int, int, bytes]]]:
        """The stored rows after `after` (up to `until_seq`), undecoded, in seq order.

        (seq, stream, version, type, schema, ts, body); `scan_fold` reads
        fewer columns for the folds. One cursor on a connection of its own
        (one consistent snapshot of the log), open while the `with` block
        runs; `node` is not read.

        With `prefix`, only rows of the streams starting with it (or, with
        `other_streams`, of every other stream), plus the rows of
        `also_types` wherever they are: SQLite filters, Python sees only
        the rows it asked for.
        """
        where, params = _scan_filter(after, until_seq, prefix, other_streams, also_types)
        conn = sqlite3.connect(self._read_uri, uri=True, check_same_thread=False)
        try:
            yield conn.execute(
                f"SELECT seq, stream, version, type, schema, ts, body FROM events {where} "
                "ORDER BY seq",
                params,
            )
        finally:
            conn.close()

    @contextlib.contextmanager
    def scan_fold(
        self,
        after: int = 0,
        until_seq: int | None = None,
        *,
        prefix: str = "",
        other_streams: bool = False,
        also_types: Sequence[str] = (),
    ) -> Iterator[FoldRows]:
        """`scan_rows` for `projections.asw.Asw.fold_rows`: only the columns a fold reads.

        Rows are (stream, version, ts, body, legacy) (`events.foldrows`), the
        same rows `scan_rows` selects with the same arguments, in one read
        transaction with the seq of the last of them (`FoldRows.last_seq`).
        """
        where, params = _scan_filter(after, until_seq, prefix, other_streams, also_types)
        conn = sqlite3.connect(
            self._read_uri, uri=True, check_same_thread=False, isolation_level=None
        )
        try:
            conn.execute("BEGIN")  # one snapshot for the last seq and the rows
            last = conn.execute(  # read backwards from the top: stops at the first row
                f"SELECT seq FROM events {where} ORDER BY seq DESC LIMIT 1", params
            ).fetchone()
            rows = conn.execute(
                f"SELECT stream, version, ts, body, {_LEGACY} FROM events {where} ORDER BY seq",
                params,
            )
            yield FoldRows(rows, after if last is None else int(last[0]))
        finally:
            conn.close()

    def count_between(self, after: int, until_seq: int) -> int:
        """How many events have `after` < seq <= `until_seq`."""
        with self._read_lock:
            row = self._reader.execute(
                "SELECT count(*) FROM events WHERE seq > ? AND seq <= ?", (after, until_seq)
            ).fetchone()
        return int(row[0])

    def read_stream(self, stream: str, after_version: int = 0) -> list[Envelope]:
        """One stream's events with version greater than `after_version`."""
        with self._read_lock:
            rows = self._reader.execute(
                _STREAM_ROWS, {"stream": stream, "after": after_version}
            ).fetchall()
        return list(_decode_rows(rows))

    def read_time_range(self, start_us: int, end_us: int) -> Iterator[Envelope]:
        """Events with `start_us` <= ts < `end_us`, in commit order."""
        sql = (
            f"SELECT {_COLUMNS} FROM events WHERE ts >= ? AND ts < ? AND seq > ? "
            "ORDER BY seq LIMIT ?"
        )
        last = 0
        while True:
            with self._read_lock:
                rows = self._reader.execute(sql, (start_us, end_us, last, _READ_CHUNK)).fetchall()
            yield from _decode_rows(rows)
            if len(rows) < _READ_CHUNK:
                return
            last = rows[-1][0]

    def seq_at_time(self, ts_us: int) -> int:
        """The last `seq` committed at or before `ts_us` (0 if none)."""
        with self._read_lock:
            row = self._reader.execute(
                "SELECT max(seq) FROM events WHERE ts <= ?", (ts_us,)
            ).fetchone()
        return int(row[0] or 0)

    def streams(self) -> list[str]:
        """Every stream name in the log, sorted."""
        with self._read_lock:
            return [r[0] for r in self._reader.execute(_STREAMS)]

    def has_stream(self, stream: str, *, prefix: bool = False) -> bool:
        """Whether the log holds events of `stream` (with `prefix`: of any stream starting so)."""
        if not prefix:
            return self.stream_version(stream) > 0
        if not stream:
            return self.last_seq() > 0
        # Every name starting with `stream` sorts in [stream, stream with its last char + 1).
        end = stream[:-1] + chr(ord(stream[-1]) + 1)
        with self._read_lock:
            row = self._reader.execute(_HAS_STREAM_IN, {"lo": stream, "hi": end}).fetchone()
        return row is not None

    # ------------------------------------------------------------- snapshots

    @property
    def snapshots(self) -> SnapshotStore:
        """The log's snapshot tables (`events.snapshots`); saving needs a writable log."""
        store = self._snapshots
        if store is None:
            with self._lock:
                store = self._snapshots
                if store is None:
                    store = self._snapshots = SnapshotStore(
                        self.path,
                        self._read_uri,
                        write=None if self.readonly else self.write_derived,
                    )
                    if self._closed:
                        store.close()
        return store

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
        work = _CursorWrite(name, seq)
        self._submit(work)  # cursor writes share the write connection and its commits
        work.lock.acquire()
        if isinstance(work.result, BaseException):
            raise work.result

    def cursors(self) -> dict[str, int]:
        """All named cursors."""
        with self._read_lock:
            return {n: s for n, s in self._reader.execute("SELECT name, seq FROM cursors")}

    # ----------------------------------------------------------------- close

    def close(self) -> None:
        """Finish queued appends, stop the writer and release the write lock."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if self._snapshots is not None:
            self._snapshots.close()
        if self._writer_thread is not None:
            self._writer_thread.join()
            self._writer.close()
        self._reader.close()
        self._release_lock()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decode_rows(rows: Iterable[Row]) -> Iterator[Envelope]:
    """Envelopes of stored rows; current-schema bodies take the one-decoder fast path."""
    schemas = CURRENT_SCHEMAS
    decode = decode_current_body
    make = Envelope
    for seq, stream, version, type_name, schema, ts, node, data in rows:
        if schemas.get(type_name) == schema:
            body = decode(data)
        else:
            body = decode_body(type_name, schema, data)
            schema = type(body).SCHEMA
        yield make(
            seq=seq,
            stream=stream,
            version=version,
            type=type_name,
            schema=schema,
            ts=ts,
            node=node,
            body=body,
        )


class _Transaction:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
