"""The analytics store: Parquet partitions read by DuckDB, and one SQLite catalog per partition.

Layout of a store directory (the `--db` path)::

    _catalog/part=P.sqlite      the catalog of ingest partition P (one writer each)
    events/day=YYYY-MM-DD/part=P/NNNNNNNN.parquet    flattened events, by event time
    samples/day=.../part=P/...  finished operations (and derived stages), by end time
    spans/day=.../part=P/...    closed Uncertain spans, by end time
    ready/day=.../part=P/...    pods whose volumes all mounted, by ready time
    waits/day=.../part=P/...    steps of pods' waits for their claims, by end time

A catalog holds what must change together with each batch: the applied
(node, seq) ranges and the fold's open state (one encoded blob), the
recent batches not yet in Parquet (the hot tier: Arrow IPC blobs, one per
table and batch), the Parquet files committed so far, gaps noticed,
rejected messages and counters. One batch is one SQLite transaction
(WAL, `synchronous=FULL`): its rows, the ranges that mark them applied and
the open state commit together, so a crash keeps the whole batch or none
of it, and a redelivered event is recognised by the ranges committed with
its row. The aggregator acknowledges a batch only after its commit.

Compaction moves the hot tier into Parquet files (one per table and day),
sorted, zstd-compressed: each file is written under a temporary name,
synced and renamed, then one catalog transaction lists the files and
drops the hot batches they hold. A `samples` or `ready` file gets a
sidecar first, its durations sorted (`volfsm.analytics.sortedruns`),
written the same way, so a listed file always has one. A crash before the
catalog transaction leaves files no catalog lists; the next writer of that
partition deletes them and their sidecars (they are its own, and their
rows are still in the hot tier). A sidecar is deleted with its file.

Readers (reports, the dashboard, other processes) open the catalogs
read-only, take one consistent snapshot (state, file list, hot batches)
and query the files in the report's window together with the hot rows
through DuckDB. Files are never rewritten, so a snapshot stays readable.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from loguru import logger

from projections.analytics import (
    AnalyticsFold,
    EventRow,
    FoldChanges,
    GapFigure,
    NodeStats,
    OpenOp,
    PendingPod,
    UncertainSpan,
    VolumeHealth,
)
from projections.analytics.waits import OpenWait
from volfsm.analytics.columns import EVENTS, READY, SAMPLES, SPANS, TABLES, WAITS, Table, to_arrow
from volfsm.analytics.sortedruns import SUFFIX, TABLES_WITH_RUNS, sidecar_of, write_sidecar
from volfsm.analytics.tracking import SeqRanges

STORE_FORMAT = "volfsm-analytics"
STORE_SCHEMA = 2
"""Schema 1 was one SQLite file holding every row (see `volfsm.analytics.migrate`)."""

CATALOG_DIR = "_catalog"
_OWN_FILE = re.compile(r"^\.?\d{8}\.(parquet|sorted\.arrow)(\.tmp)?$")
"""The names `_write_file` gives its files and their sidecars (and their temporary names)."""
DEFAULT_COMPACT_ROWS = 200_000
DEFAULT_COMPACT_AGE_S = 300.0
MERGE_FILES = 8
"""A day of a table in this many small files or more is merged into one."""
MERGE_ROWS = 2_000_000
"""A file with fewer rows is small."""
RETIRE_AFTER_S = 120.0
"""Merged-away files are deleted this long after the merge (older snapshots may read them)."""
ROW_GROUP = 64 * 1024
_DAY_US = 86_400_000_000
_CATALOG_NAME = re.compile(r"^part=(\d+)\.sqlite$")

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state (id INTEGER PRIMARY KEY CHECK (id = 1), data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS hot (
    id INTEGER PRIMARY KEY, tbl TEXT NOT NULL, rows INTEGER NOT NULL, data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, tbl TEXT NOT NULL, day TEXT NOT NULL, rows INTEGER NOT NULL,
    lo_us INTEGER NOT NULL, hi_us INTEGER NOT NULL, bytes INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS retired (path TEXT PRIMARY KEY, since_us INTEGER NOT NULL)
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gap_log (
    node TEXT NOT NULL, from_seq INTEGER NOT NULL, to_seq INTEGER NOT NULL,
    noticed_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS rejects (
    stream_seq INTEGER PRIMARY KEY, subject TEXT NOT NULL, msg_id TEXT NOT NULL,
    error TEXT NOT NULL, data BLOB NOT NULL
);
"""


class StoreError(Exception):
    """The path is not an analytics store this build can use (or is in use)."""


class DuplicateRowError(StoreError):
    """A batch holds the same (node, seq) twice: it is refused whole."""


# --------------------------------------------------------------------------
# The open state, as one blob


class StoreState(msgspec.Struct):
    """What the aggregator needs to go on: applied ranges and the fold's open state."""

    ranges: dict[str, list[list[int]]] = {}
    open_ops: list[OpenOp] = []
    open_spans: list[UncertainSpan] = []
    pending_pods: list[PendingPod] = []
    nodes: list[NodeStats] = []
    health: list[VolumeHealth] = []
    """The latest usage and condition of each mounted pod-volume (empty in older blobs)."""
    waits: list[OpenWait] = []
    """Pods waiting for their claims (empty in older blobs: a wait that began before the
    upgrade is not counted)."""


_encode_state = msgspec.msgpack.Encoder().encode
_decode_state = msgspec.msgpack.Decoder(StoreState).decode


def encode_store_state(state: StoreState) -> bytes:
    """A state as the catalog keeps it."""
    return _encode_state(state)


def encode_state(ranges: SeqRanges, fold: AnalyticsFold) -> bytes:
    """The applied ranges and the fold's open state, as the catalog keeps them."""
    return _encode_state(
        StoreState(
            ranges.ranges,
            list(fold.open_ops.values()),
            list(fold.open_spans.values()),
            list(fold.pending_pods.values()),
            list(fold.nodes.values()),
            list(fold.health.volumes.values()),
            list(fold.waits.open.values()),
        )
    )


# --------------------------------------------------------------------------
# Batches


@dataclass(slots=True)
class Reject:
    """A message no decoder of this build reads: kept, acknowledged, counted."""

    stream_seq: int
    subject: str
    msg_id: str
    error: str
    data: bytes


@dataclass(slots=True)
class Batch:
    """Everything one transaction writes."""

    rows: list[EventRow] = field(default_factory=list)
    changes: FoldChanges = field(default_factory=FoldChanges)
    ranges: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """The applied ranges of every node the batch touched (as they are after it)."""
    state: bytes = b""
    """`encode_state` after the batch (taken when the batch was finished)."""
    gaps: list[tuple[str, int, int, int]] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    duplicates: int = 0
    position: tuple[str, int] | None = None
    """(JetStream stream name, last stream sequence in the batch)."""

    def tables(self) -> dict[str, pa.Table]:
        """The batch's new rows, per store table (empty ones left out)."""
        ch = self.changes
        rows: dict[Table, Sequence[Any]] = {
            EVENTS: self.rows,
            SAMPLES: ch.samples,
            SPANS: ch.closed_spans,
            READY: ch.ready,
            WAITS: ch.waits,
        }
        return {t.name: to_arrow(t, r) for t, r in rows.items() if r}


@dataclass(slots=True)
class IngestCounters:
    """The aggregator's own figures, as committed."""

    applied: int
    duplicates: int
    undecodable: int
    gaps_noticed: int
    stream: str
    stream_seq: int


def _check_unique(rows: Sequence[EventRow]) -> None:
    keys = {(r.node, r.seq) for r in rows}
    if len(keys) != len(rows):
        raise DuplicateRowError("a batch holds the same (node, seq) twice; nothing was written")


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _from_ipc(data: bytes) -> pa.Table:
    with pa.ipc.open_stream(data) as reader:
        return reader.read_all()


def _day(day_number: int) -> str:
    return datetime.fromtimestamp(day_number * 86_400, tz=UTC).strftime("%Y-%m-%d")


def _split_days(table: Table, rows: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """The rows of each UTC day (of the table's time column), day by day."""
    days = pc.floor(pc.divide(rows[table.time].cast(pa.float64()), float(_DAY_US)))
    days = days.cast(pa.int64())
    for number in sorted(pc.unique(days).to_pylist()):
        yield _day(number), rows.filter(pc.equal(days, number))


FileRow = tuple[str, str, str, int, int, int, int]
"""A `files` row: (path, table, day, rows, lo_us, hi_us, bytes)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------
# Snapshots


@dataclass(slots=True)
class DataFile:
    """A committed Parquet file: its table, absolute path and the interval its rows cover."""

    table: str
    path: Path
    rows: int
    lo_us: int
    hi_us: int


@dataclass(slots=True)
class Snapshot:
    """One consistent read of one or more catalogs."""

    partitions: list[int]
    of: int
    state: StoreState
    files: list[DataFile]
    hot: dict[str, list[bytes]]
    counters: IngestCounters

    def files_in(self, table: str, lo_us: int, hi_us: int) -> list[DataFile]:
        """The files of `table` with rows whose interval meets [lo_us, hi_us)."""
        return [f for f in self.files if f.table == table and f.hi_us >= lo_us and f.lo_us < hi_us]

    def hot_table(self, table: str) -> pa.Table:
        """The hot rows of `table` (not yet in Parquet) as one Arrow table."""
        parts = [_from_ipc(b) for b in self.hot.get(table, ())]
        if not parts:
            return TABLES[table].schema.empty_table()
        return pa.concat_tables(parts)

    def seq_ranges(self) -> SeqRanges:
        """The applied ranges."""
        return SeqRanges(ranges={n: [list(r) for r in rs] for n, rs in self.state.ranges.items()})

    def gaps(self) -> list[GapFigure]:
        """Gaps still open: seqs of a node never received between two received ones."""
        return [GapFigure(n, lo, hi, hi - lo + 1) for n, lo, hi in self.seq_ranges().holes()]


class Catalog:
    """The SQLite catalog of one partition."""

    def __init__(self, path: Path, *, read_only: bool) -> None:
        self.path = path
        if read_only:
            uri = f"file:{path}?mode=ro"
            self.conn = sqlite3.connect(
                uri, uri=True, isolation_level=None, check_same_thread=False
            )
        else:
            self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA busy_timeout = 10000")
        if not read_only:
            self.conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # a new file only
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = FULL")
            self.conn.executescript(_DDL)

    def meta(self) -> dict[str, str]:
        """The meta table."""
        try:
            return dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a volfsm analytics catalog ({exc})") from None

    def read(
        self, root: Path
    ) -> tuple[StoreState, list[DataFile], dict[str, list[bytes]], IngestCounters]:
        """State, files, hot batches and counters, in one read transaction."""
        c = self.conn
        c.execute("BEGIN")
        try:
            meta = self.meta()
            row = c.execute("SELECT data FROM state WHERE id = 1").fetchone()
            state = _decode_state(row[0]) if row is not None else StoreState()
            files = [
                DataFile(t, root / p, n, lo, hi)
                for p, t, n, lo, hi in c.execute(
                    "SELECT path, tbl, rows, lo_us, hi_us FROM files ORDER BY path"
                )
            ]
            hot: dict[str, list[bytes]] = {}
            for tbl, data in c.execute("SELECT tbl, data FROM hot ORDER BY id"):
                hot.setdefault(tbl, []).append(data)
            undecodable = c.execute("SELECT count(*) FROM rejects").fetchone()[0]
            noticed = c.execute("SELECT count(*) FROM gap_log").fetchone()[0]
        finally:
            c.execute("COMMIT")
        counters = IngestCounters(
            applied=sum(n.events for n in state.nodes),
            duplicates=int(meta.get("duplicates", 0)),
            undecodable=int(undecodable),
            gaps_noticed=int(noticed),
            stream=meta.get("stream", ""),
            stream_seq=int(meta.get("stream_seq", 0)),
        )
        return state, files, hot, counters

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


def _check_catalog(catalog: Catalog, partition: int, of: int | None) -> int:
    meta = catalog.meta()
    if meta.get("format") != STORE_FORMAT:
        raise StoreError(f"{catalog.path}: not a volfsm analytics catalog")
    if int(meta.get("schema", "0")) > STORE_SCHEMA:
        raise StoreError(
            f"{catalog.path}: written by a newer volfsm (store schema {meta['schema']})"
        )
    if int(meta.get("partition", "-1")) != partition:
        raise StoreError(f"{catalog.path}: holds partition {meta.get('partition')}")
    partitions = int(meta.get("partitions", "1"))
    if of is not None and partitions != of:
        raise StoreError(
            f"{catalog.path}: partition {partition} of {partitions}, not of {of} "
            "(the partition count is fixed when a store is made)"
        )
    return partitions


def _create_catalog(path: Path, partition: int, partitions: int) -> None:
    """Make a new catalog under a temporary name and rename it: readers never see half of one."""
    tmp = path.with_name(f".{path.name}.new")
    for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
        leftover.unlink(missing_ok=True)
    catalog = Catalog(tmp, read_only=False)
    try:
        catalog.conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [
                ("format", STORE_FORMAT),
                ("schema", str(STORE_SCHEMA)),
                ("partition", str(partition)),
                ("partitions", str(partitions)),
            ],
        )
    finally:
        catalog.close()
    os.rename(tmp, path)
    _fsync_dir(path.parent)


def old_store_message(path: Path) -> str | None:
    """Why `path` cannot be opened if it is a store of an earlier volfsm (one SQLite file)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head != b"SQLite format 3\x00":
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return None
    if meta.get("format") != STORE_FORMAT:
        return None
    return (
        f"{path} is an analytics store of an earlier volfsm (one SQLite file, store schema "
        f"{meta.get('schema')}); this volfsm keeps a directory of Parquet files. Convert it "
        f"with: volfsm analytics migrate --from {path} --to NEW_DIR (the old file is only read)"
    )


def _not_a_store(path: Path) -> StoreError:
    old = old_store_message(path)
    if old is not None:
        return StoreError(old)
    return StoreError(f"{path}: not a volfsm analytics store")


def catalog_paths(root: Path) -> dict[int, Path]:
    """The catalogs under a store directory, by partition."""
    found: dict[int, Path] = {}
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in (root / CATALOG_DIR).iterdir():
            match = _CATALOG_NAME.match(entry.name)
            if match:
                found[int(match.group(1))] = entry
    return found


class AnalyticsStore:
    """A store directory: the writer of one partition, or a reader of every partition in it.

    `path` may also be a list of store directories to read together (each
    holding different partitions of the same partition count); `only` reads
    one partition of them.
    """

    keeps_state_blob = True
    """Batches must carry `encode_state` (the ranges and open state are kept as one blob)."""

    def __init__(
        self,
        path: Path | str | Sequence[Path | str],
        *,
        read_only: bool = False,
        partition: int = 0,
        partitions: int = 1,
        compact_rows: int = DEFAULT_COMPACT_ROWS,
        compact_age_s: float = DEFAULT_COMPACT_AGE_S,
        only: int | None = None,
    ) -> None:
        roots = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        if not roots:
            raise StoreError("no store given")
        self.path = roots[0]
        self.roots = roots
        self.read_only = read_only
        self.compact_rows = compact_rows
        self.compact_age_s = compact_age_s
        self._lock_fd: int | None = None
        self._catalogs: list[tuple[Path, int, Catalog]] = []
        self.partition = partition
        self.partitions = partitions
        try:
            if read_only:
                self._open_readers(only)
            else:
                if len(roots) != 1:
                    raise StoreError("a writer writes one store directory")
                self._open_writer(partition, partitions)
        except BaseException:
            self.close()
            raise
        self._hot_rows = 0
        self._hot_since = 0.0

    # -------------------------------------------------------------- opening

    def _open_readers(self, only: int | None) -> None:
        of: int | None = None
        seen: dict[int, Path] = {}
        for root in self.roots:
            if not root.exists():
                raise StoreError(f"{root}: no analytics store there")
            if not root.is_dir():
                raise _not_a_store(root)
            catalogs = catalog_paths(root)
            if not catalogs:
                raise StoreError(f"{root}: no analytics store there (no {CATALOG_DIR}/)")
            for part, cpath in sorted(catalogs.items()):
                if only is not None and part != only:
                    continue
                if part in seen:
                    raise StoreError(f"partition {part} is both in {seen[part]} and in {root}")
                seen[part] = root
                catalog = Catalog(cpath, read_only=True)
                self._catalogs.append((root, part, catalog))
                of = _check_catalog(catalog, part, of)
        self.partitions = of or 1

    def _open_writer(self, partition: int, partitions: int) -> None:
        root = self.path
        if partitions < 1 or not 0 <= partition < partitions:
            raise StoreError(f"partition {partition} of {partitions} does not exist")
        if root.exists() and not root.is_dir():
            raise _not_a_store(root)
        if not (root / CATALOG_DIR).is_dir() and root.is_dir() and any(root.iterdir()):
            # A store deletes the Parquet files its catalog does not list: it is only ever
            # made in a new or empty directory, never over files that are not its own.
            raise StoreError(
                f"{root}: not a volfsm analytics store, and not empty: a new store is made "
                "only in a new or empty directory (give --db another path)"
            )
        for part, cpath in catalog_paths(root).items():
            if part != partition:
                with contextlib.closing(Catalog(cpath, read_only=True)) as other:
                    _check_catalog(other, part, partitions)
        (root / CATALOG_DIR).mkdir(parents=True, exist_ok=True)
        self._lock(root / CATALOG_DIR / f"part={partition}.lock")
        path = root / CATALOG_DIR / f"part={partition}.sqlite"
        if not path.exists():
            _create_catalog(path, partition, partitions)
        catalog = Catalog(path, read_only=False)
        self._catalogs.append((root, partition, catalog))
        _check_catalog(catalog, partition, partitions)
        self._remove_uncommitted()

    def _lock(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(
                f"{self.path}: partition {self.partition} is being written by another process"
            ) from None
        self._lock_fd = fd

    def _remove_uncommitted(self) -> None:
        """Delete this partition's Parquet files that no catalog lists (a compaction cut short)."""
        root, partition, catalog = self._catalogs[0]
        listed = {
            p
            for (p,) in catalog.conn.execute(
                "SELECT path FROM files UNION SELECT path FROM retired"
            )
        }
        for table in TABLES:
            for path in (root / table).glob(f"day=*/part={partition}/*"):
                rel = path.relative_to(root).as_posix()
                if rel in listed or rel.removesuffix(SUFFIX) + ".parquet" in listed:
                    continue  # a listed file, or the sidecar of one
                if _OWN_FILE.match(path.name) and path.is_file() and not path.is_symlink():
                    path.unlink()
                else:
                    logger.warning("analytics store: {} is not one of its files; kept", path)
        self._delete_retired(RETIRE_AFTER_S)

    def close(self) -> None:
        """Close the catalogs (and release the partition)."""
        for _root, _part, catalog in self._catalogs:
            catalog.close()
        self._catalogs = []
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> AnalyticsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def partitions_read(self) -> set[int]:
        """The partitions whose catalogs this store has open."""
        return {part for _root, part, _catalog in self._catalogs}

    @property
    def _writer(self) -> Catalog:
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        return self._catalogs[0][2]

    # ---------------------------------------------------------------- state

    def load_state(self) -> tuple[SeqRanges, AnalyticsFold]:
        """The committed applied ranges and a fold holding the committed open state."""
        snap = self.snapshot()
        fold = AnalyticsFold()
        st = snap.state
        fold.restore(st.open_ops, st.open_spans, st.pending_pods, st.nodes, st.health, st.waits)
        return snap.seq_ranges(), fold

    # --------------------------------------------------------------- writing

    def commit(self, batch: Batch) -> None:
        """Write one batch in one transaction (all of it or none); compact when due."""
        _check_unique(batch.rows)
        tables = batch.tables()
        self.commit_tables(
            tables,
            state=batch.state,
            gaps=batch.gaps,
            rejects=batch.rejects,
            duplicates=batch.duplicates,
            position=batch.position,
        )
        if self._compaction_due():
            self.compact()

    def commit_tables(
        self,
        tables: dict[str, pa.Table],
        *,
        state: bytes,
        gaps: Sequence[tuple[str, int, int, int]] = (),
        rejects: Sequence[Reject] = (),
        duplicates: int = 0,
        position: tuple[str, int] | None = None,
    ) -> None:
        """Add rows to the hot tier with the state, gaps, rejects and counters: one transaction."""
        c = self._writer.conn
        hot = [(name, t.num_rows, _ipc(t)) for name, t in tables.items() if t.num_rows]
        c.execute("BEGIN IMMEDIATE")
        try:
            c.executemany("INSERT INTO hot (tbl, rows, data) VALUES (?, ?, ?)", hot)
            c.execute("INSERT OR REPLACE INTO state (id, data) VALUES (1, ?)", (state,))
            c.executemany("INSERT INTO gap_log VALUES (?, ?, ?, ?)", gaps)
            c.executemany(
                "INSERT OR IGNORE INTO rejects VALUES (?, ?, ?, ?, ?)",
                [(r.stream_seq, r.subject, r.msg_id, r.error, r.data) for r in rejects],
            )
            if duplicates:
                c.execute(
                    "INSERT INTO meta (key, value) VALUES ('duplicates', ?) ON CONFLICT(key) "
                    "DO UPDATE SET value = CAST(value AS INTEGER) + excluded.value",
                    (duplicates,),
                )
            if position is not None:
                c.execute("INSERT OR REPLACE INTO meta VALUES ('stream', ?)", (position[0],))
                c.execute("INSERT OR REPLACE INTO meta VALUES ('stream_seq', ?)", (position[1],))
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        events = tables.get("events")
        if events is not None and events.num_rows:
            if not self._hot_rows:
                self._hot_since = time.monotonic()
            self._hot_rows += events.num_rows

    def _compaction_due(self) -> bool:
        if not self._hot_rows:
            return False
        age = time.monotonic() - self._hot_since
        return self._hot_rows >= self.compact_rows or age >= self.compact_age_s

    def compact(self) -> int:
        """Move every hot batch into Parquet files (one per table and day); files written.

        Then a day of a table left in `MERGE_FILES` small files or more is
        merged into one; the merged files are deleted `RETIRE_AFTER_S` later
        (readers holding an older snapshot may still read them).
        """
        c = self._writer.conn
        rows = c.execute("SELECT id, tbl, data FROM hot ORDER BY id").fetchall()
        self._hot_rows = 0
        if not rows:
            return 0
        by_table: dict[str, list[pa.Table]] = {}
        for _id, tbl, data in rows:
            by_table.setdefault(tbl, []).append(_from_ipc(data))
        counter = self._next_file()
        written: list[FileRow] = []
        for name, parts in by_table.items():
            for day, part in _split_days(TABLES[name], pa.concat_tables(parts)):
                written.append(self._write_file(TABLES[name], day, part, counter))
                counter += 1
        with self._transaction() as c:
            c.executemany("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)", written)
            c.execute("DELETE FROM hot WHERE id <= ?", (rows[-1][0],))
            c.execute("INSERT OR REPLACE INTO meta VALUES ('next_file', ?)", (str(counter),))
        for name, day in sorted({(f[1], f[2]) for f in written}):
            self._merge_day(TABLES[name], day)
        self._delete_retired(RETIRE_AFTER_S)
        self._shrink()
        return len(written)

    def _shrink(self) -> None:
        """Give back the pages the hot batches held, and empty the WAL (when no reader holds it)."""
        c = self._writer.conn
        c.executescript("PRAGMA incremental_vacuum;")  # execute() would free one page
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        c = self._writer.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise

    def _next_file(self) -> int:
        row = self._writer.conn.execute("SELECT value FROM meta WHERE key = 'next_file'").fetchone()
        return int(row[0]) if row is not None else 1

    def _write_file(self, table: Table, day: str, rows: pa.Table, counter: int) -> FileRow:
        """Write `rows` sorted into a new Parquet file of `day` (synced, renamed into place)."""
        root, partition, _catalog = self._catalogs[0]
        rel = f"{table.name}/day={day}/part={partition}/{counter:08d}.parquet"
        final = root / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.tmp")
        ordered = rows.sort_by([(c, "ascending") for c in table.sort])
        if table.name in TABLES_WITH_RUNS:  # first: a listed file always has its sidecar
            write_sidecar(table.name, ordered, sidecar_of(final))
        pq.write_table(ordered, tmp, compression="zstd", row_group_size=ROW_GROUP)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        return (
            rel,
            table.name,
            day,
            rows.num_rows,
            pc.min(rows[table.start]).as_py(),
            pc.max(rows[table.time]).as_py(),
            final.stat().st_size,
        )

    def _merge_day(self, table: Table, day: str) -> None:
        """Merge a day's small files of `table` into one when there are `MERGE_FILES` or more."""
        root = self._catalogs[0][0]
        small = self._writer.conn.execute(
            "SELECT path FROM files WHERE tbl = ? AND day = ? AND rows < ? ORDER BY path",
            (table.name, day, MERGE_ROWS),
        ).fetchall()
        if len(small) < MERGE_FILES:
            return
        paths = [p for (p,) in small]
        merged = pa.concat_tables(pq.read_table(root / p, schema=table.schema) for p in paths)
        counter = self._next_file()
        row = self._write_file(table, day, merged, counter)
        now_us = time.time_ns() // 1000
        with self._transaction() as c:
            c.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)", row)
            c.executemany("DELETE FROM files WHERE path = ?", [(p,) for p in paths])
            c.executemany("INSERT INTO retired VALUES (?, ?)", [(p, now_us) for p in paths])
            c.execute("INSERT OR REPLACE INTO meta VALUES ('next_file', ?)", (str(counter + 1),))

    def _delete_retired(self, after_s: float) -> None:
        """Delete merged-away files retired more than `after_s` ago."""
        root = self._catalogs[0][0]
        c = self._writer.conn
        cutoff = time.time_ns() // 1000 - round(after_s * 1e6)
        old = [p for (p,) in c.execute("SELECT path FROM retired WHERE since_us <= ?", (cutoff,))]
        for path in old:
            (root / path).unlink(missing_ok=True)
            sidecar_of(root / path).unlink(missing_ok=True)
        if old:
            with self._transaction() as tx:
                tx.executemany("DELETE FROM retired WHERE path = ?", [(p,) for p in old])

    # --------------------------------------------------------------- reading

    def snapshot(self) -> Snapshot:
        """One consistent read of every catalog (each in one read transaction)."""
        states: list[StoreState] = []
        files: list[DataFile] = []
        hot: dict[str, list[bytes]] = {}
        counters: list[IngestCounters] = []
        for root, _part, catalog in self._catalogs:
            state, cat_files, cat_hot, cat_counters = catalog.read(root)
            states.append(state)
            files.extend(cat_files)
            for name, blobs in cat_hot.items():
                hot.setdefault(name, []).extend(blobs)
            counters.append(cat_counters)
        return Snapshot(
            partitions=[part for _root, part, _c in self._catalogs],
            of=self.partitions,
            state=_merge_states(states),
            files=files,
            hot=hot,
            counters=_merge_counters(counters),
        )

    def position(self) -> tuple[str, int] | None:
        """(stream, stream sequence) of the last committed batch, if any."""
        counters = self.snapshot().counters
        if not counters.stream:
            return None
        return counters.stream, counters.stream_seq

    def event_count(self) -> int:
        """How many events the store holds."""
        return sum(n.events for n in self.snapshot().state.nodes)

    def counters(self) -> IngestCounters:
        """The aggregators' committed counters (summed over partitions)."""
        return self.snapshot().counters

    def nodes(self) -> list[NodeStats]:
        """Per-node counters, by node name."""
        return sorted(self.snapshot().state.nodes, key=lambda n: n.node)

    def open_spans(self) -> list[UncertainSpan]:
        """Devices and pod-volumes Uncertain now."""
        return list(self.snapshot().state.open_spans)

    def gaps(self) -> list[GapFigure]:
        """Gaps still open: seqs of a node never received between two received ones."""
        return self.snapshot().gaps()

    def gap_log(self) -> list[tuple[str, int, int, int]]:
        """Every gap as noticed: (node, from_seq, to_seq, noticed_us)."""
        rows: list[tuple[str, int, int, int]] = []
        for _root, _part, catalog in self._catalogs:
            rows.extend(catalog.conn.execute("SELECT * FROM gap_log"))
        return sorted(rows, key=lambda r: (r[3], r[0]))

    def rejects(self) -> list[Reject]:
        """Every message kept as undecodable."""
        found: list[Reject] = []
        for _root, _part, catalog in self._catalogs:
            found.extend(
                Reject(*row)
                for row in catalog.conn.execute(
                    "SELECT stream_seq, subject, msg_id, error, data FROM rejects"
                )
            )
        return found

    def pending_pods(self) -> int:
        """Pods not ready yet."""
        return len(self.snapshot().state.pending_pods)

    def count(self, table: str) -> int:
        """Rows of one of the store's tables (events, samples, spans, ready)."""
        from volfsm.analytics.query import StoreQuery

        if table not in TABLES:
            raise ValueError(f"no table {table!r} in an analytics store")
        with StoreQuery(self.snapshot()) as query:
            return query.count(table)

    def iter_events(
        self, since_us: int | None = None, chunk: int = 50_000
    ) -> Iterator[list[tuple[object, ...]]]:
        """Event rows (ROW_COLUMNS order) stamped at or after `since_us`, in chunks, by node
        and seq."""
        from volfsm.analytics.query import StoreQuery

        with StoreQuery(self.snapshot()) as query:
            yield from query.iter_events(since_us, chunk)


def _merge_states(states: list[StoreState]) -> StoreState:
    if len(states) == 1:
        return states[0]
    merged = StoreState(ranges={})
    for st in states:
        merged.ranges.update(st.ranges)
        merged.open_ops.extend(st.open_ops)
        merged.open_spans.extend(st.open_spans)
        merged.pending_pods.extend(st.pending_pods)
        merged.nodes.extend(st.nodes)
        merged.health.extend(st.health)
        merged.waits.extend(st.waits)
    return merged


def _merge_counters(counters: list[IngestCounters]) -> IngestCounters:
    if len(counters) == 1:
        return counters[0]
    streams = {c.stream for c in counters if c.stream}
    return IngestCounters(
        applied=sum(c.applied for c in counters),
        duplicates=sum(c.duplicates for c in counters),
        undecodable=sum(c.undecodable for c in counters),
        gaps_noticed=sum(c.gaps_noticed for c in counters),
        stream=",".join(sorted(streams)),
        stream_seq=max((c.stream_seq for c in counters), default=0),
    )
