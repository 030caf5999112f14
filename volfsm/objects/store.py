"""The node's object store: every applied object, kept in `<data-dir>/objects/objects.db`.

A SQLite file of its own (WAL, `synchronous=FULL`), in a directory of mode
0700 with the file 0600: it holds Secret values, which must never reach
the event log (`volfsm.db`), its WAL, NATS or any log output. The event
log records each change as ObjectApplied / ObjectDeleted with a content
hash (see `volfsm.objects.hashing`).

A change is written here first (durable, marked "not yet logged", with the
row it replaces), then recorded in the event log, then published: the
in-memory view readers use is updated and listeners are told. A crash in
between leaves the row pending; at the next start `recover` asks the log:
if its event is there the change stands, else it is rolled back (the
caller never heard it succeed). A failed log append rolls it back at once.

Every read is from memory: no I/O on a plugin's path.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loguru import logger as log

from volfsm.desired.errors import InvalidObjectError
from volfsm.desired.kinds import ClusterTrustBundle, CSIDriver, ServiceAccount
from volfsm.desired.meta import LabelSelector
from volfsm.desired.objects import Pod, decode_object
from volfsm.desired.plan import AppliedObject, ObjectKey, StoredInfo
from volfsm.errors import VolfsmError
from volfsm.objects.hashing import content_hash
from volfsm.objects.model import ObjectChange, StoredObject, StoreWrite
from volfsm.objects.views import (
    ConfigMapData,
    SecretData,
    bundles_by_signer,
    config_map_data,
    secret_data,
)

DIRNAME = "objects"
FILENAME = "objects.db"
SCHEMA_VERSION = 1
DIR_MODE = 0o700
FILE_MODE = 0o600

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS objects (
    kind TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    uid TEXT NOT NULL,
    resource_version INTEGER NOT NULL,
    content_hash TEXT NOT NULL,
    body TEXT NOT NULL,
    created_us INTEGER NOT NULL,
    updated_us INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    logged INTEGER NOT NULL DEFAULT 1,
    prev TEXT,
    PRIMARY KEY (kind, namespace, name)
);
"""
_COLUMNS = (
    "kind, namespace, name, uid, resource_version, content_hash, body, created_us, updated_us"
)


class ObjectStoreError(VolfsmError):
    """The object store cannot be opened or written."""


Listener = Callable[[list[ObjectChange]], None]
LastEvent = Callable[[ObjectKey], tuple[str, int] | None]
"""(event type, resource_version) of the last event the log holds for an object, or None."""


class ObjectStore:
    """The node-local object store (see the module docstring). Open it before use."""

    def __init__(self, directory: Path | str | None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._objects: dict[ObjectKey, StoredObject] = {}
        self._listeners: list[Listener] = []
        self._to_mark: set[ObjectKey] = set()
        self._revision = 0
        self._secret_key = b""

    @classmethod
    def beside(cls, log_path: Path | str) -> ObjectStore:
        """The store of the data dir holding the event log `log_path`."""
        return cls(Path(log_path).parent / DIRNAME)

    @property
    def path(self) -> Path | None:
        """The SQLite file (None for a store kept in memory only)."""
        return self.directory / FILENAME if self.directory is not None else None

    # ------------------------------------------------------------- lifecycle

    def open(self, last_event: LastEvent | None = None) -> None:
        """Open (create) the file, settle changes a crash left pending, load every object.

        `last_event` answers what the event log last recorded for an object;
        without it every pending change is rolled back.
        """
        conn = self._connect()
        with self._lock:
            self._conn = conn
            conn.executescript(_SCHEMA)
            self._load_meta(conn)
            self._recover(conn, last_event or (lambda _key: None))
            self._objects = dict(self._read_all(conn))

    def _connect(self) -> sqlite3.Connection:
        path = self.path
        if path is None:
            return sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        assert self.directory is not None
        _private_dir(self.directory)
        _private_file(path)
        try:
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as exc:
            raise ObjectStoreError(f"{path}: cannot open the object store: {exc}") from None
        return conn

    def _load_meta(self, conn: sqlite3.Connection) -> None:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        schema = int(meta.get("schema", SCHEMA_VERSION))
        if schema > SCHEMA_VERSION:
            raise ObjectStoreError(
                f"{self.path}: object store schema {schema} is newer than this volfsm's "
                f"({SCHEMA_VERSION})"
            )
        key = meta.get("secret_hash_key")
        if key is None:
            key = secrets.token_hex(32)
            with _transaction(conn):
                conn.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('schema', ?), ('secret_hash_key', ?), "
                    "('revision', ?)",
                    (str(SCHEMA_VERSION), key, "0"),
                )
        self._secret_key = bytes.fromhex(key)
        self._revision = int(meta.get("revision", "0"))

    def close(self) -> None:
        """Write the pending "logged" marks and close the file."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is None:
                return
            with contextlib.suppress(sqlite3.Error):
                with _transaction(conn):
                    self._apply_marks(conn)
                conn.close()

    # ----------------------------------------------------------------- reads

    def get(self, kind: str, namespace: str, name: str) -> StoredObject | None:
        """The object (kind, namespace, name); namespace "" for cluster-scoped kinds."""
        return self._objects.get((kind, namespace, name))

    def objects(self, kind: str | None = None, namespace: str | None = None) -> list[StoredObject]:
        """Objects of a kind (all kinds: None), optionally of one namespace, sorted by key."""
        found = [
            obj
            for key, obj in self._objects.items()
            if (kind is None or key[0] == kind) and (namespace is None or key[1] == namespace)
        ]
        return sorted(found, key=lambda o: o.key)

    def config_map(self, namespace: str, name: str) -> ConfigMapData | None:
        """A ConfigMap's keys and version, or None."""
        found = self.get("ConfigMap", namespace, name)
        return config_map_data(found) if found is not None else None

    def secret(self, namespace: str, name: str) -> SecretData | None:
        """A Secret's decoded values and version, or None."""
        found = self.get("Secret", namespace, name)
        return secret_data(found) if found is not None else None

    def service_account(self, namespace: str, name: str) -> ServiceAccount | None:
        """A ServiceAccount, or None."""
        found = self.get("ServiceAccount", namespace, name)
        return found.obj if found is not None and isinstance(found.obj, ServiceAccount) else None

    def csi_driver(self, name: str) -> CSIDriver | None:
        """A CSIDriver (its spec with the API server's defaults), or None."""
        found = self.get("CSIDriver", "", name)
        return found.obj if found is not None and isinstance(found.obj, CSIDriver) else None

    def pod(self, namespace: str, name: str) -> Pod | None:
        """The Pod as last applied (labels, annotations, containers), or None."""
        found = self.get("Pod", namespace, name)
        return found.obj if found is not None and isinstance(found.obj, Pod) else None

    def cluster_trust_bundle(self, name: str) -> ClusterTrustBundle | None:
        """The ClusterTrustBundle `name`, or None."""
        found = self.get("ClusterTrustBundle", "", name)
        obj = found.obj if found is not None else None
        return obj if isinstance(obj, ClusterTrustBundle) else None

    def cluster_trust_bundles(
        self, signer_name: str, selector: LabelSelector | None
    ) -> list[StoredObject]:
        """The ClusterTrustBundles of a signer whose labels `selector` matches (None: none,
        as the kubelet; an empty selector: all), sorted by name."""
        return bundles_by_signer(self.objects("ClusterTrustBundle"), signer_name, selector)

    def stored_info(self, kind: str, namespace: str, name: str) -> StoredInfo | None:
        """What planning needs of a stored object (`volfsm.desired.plan.StoredLookup`)."""
        found = self.get(kind, namespace, name)
        if found is None:
            return None
        return StoredInfo(uid=found.uid, content_hash=found.content_hash, obj=found.obj)

    def content_hash(self, kind: str, raw: Mapping[str, Any]) -> str:
        """The content hash of an object (a Secret's keyed with this node's secret)."""
        return content_hash(kind, raw, self._secret_key)

    @property
    def revision(self) -> int:
        """The last resource version given."""
        return self._revision

    # ------------------------------------------------------------ listeners

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` with the changes of each published write; returns an unsubscribe."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe

    # ---------------------------------------------------------------- writes

    def write(
        self,
        changes: Sequence[AppliedObject],
        deletes: Iterable[ObjectKey] = (),
        now_us: int | None = None,
    ) -> list[StoreWrite]:
        """Write changes and deletions durably, each pending until `publish`.

        Deleting a key that is not stored is a no-op. Readers see nothing of
        it until `publish`; `revert` undoes it.
        """
        now = now_us if now_us is not None else time.time_ns() // 1000
        with self._lock:
            conn = self._require_conn()
            writes: list[StoreWrite] = []
            with _transaction(conn):
                self._apply_marks(conn)
                for applied in changes:
                    writes.append(self._upsert(conn, applied, now))
                for key in deletes:
                    before = self._objects.get(key)
                    if before is not None:
                        writes.append(self._tombstone(conn, before, now))
                conn.execute(
                    "UPDATE meta SET value = ? WHERE key = 'revision'", (str(self._revision),)
                )
            return writes

    def _next_revision(self) -> int:
        self._revision += 1
        return self._revision

    def _upsert(self, conn: sqlite3.Connection, applied: AppliedObject, now: int) -> StoreWrite:
        before = self._objects.get(applied.key)
        rv = self._next_revision()
        raw = _with_resource_version(applied.raw, rv)
        created = before.created_us if before is not None and before.uid == applied.uid else now
        after = StoredObject(
            kind=applied.kind,
            namespace=applied.namespace,
            name=applied.name,
            uid=applied.uid,
            resource_version=rv,
            content_hash=applied.content_hash or self.content_hash(applied.kind, raw),
            raw=raw,
            obj=applied.obj,
            created_us=created,
            updated_us=now,
        )
        conn.execute(
            f"INSERT OR REPLACE INTO objects ({_COLUMNS}, deleted, logged, prev) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ?)",
            (*_row(after), _prev(before)),
        )
        action = applied.action if applied.action != "unchanged" else "configured"
        return StoreWrite(applied.key, before, after, rv, action)

    def _tombstone(self, conn: sqlite3.Connection, before: StoredObject, now: int) -> StoreWrite:
        rv = self._next_revision()
        conn.execute(
            "UPDATE objects SET deleted = 1, logged = 0, resource_version = ?, updated_us = ?, "
            "prev = ? WHERE kind = ? AND namespace = ? AND name = ?",
            (rv, now, _prev(before), *before.key),
        )
        return StoreWrite(before.key, before, None, rv, "deleted")

    def purge(self, keys: Iterable[ObjectKey]) -> None:
        """Drop objects from the store without a change to tell (never logged in this log)."""
        with self._lock:
            conn = self._require_conn()
            with _transaction(conn):
                for key in keys:
                    conn.execute(
                        "DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?", key
                    )
                    self._objects.pop(key, None)

    def publish(self, writes: Sequence[StoreWrite]) -> list[ObjectChange]:
        """The writes are in the event log: show them to readers and tell the listeners."""
        changes: list[ObjectChange] = []
        with self._lock:
            for write in writes:
                self._to_mark.add(write.key)
                if write.after is None:
                    self._objects.pop(write.key, None)
                    assert write.before is not None
                    changes.append(_change(write.before, write.resource_version, deleted=True))
                else:
                    self._objects[write.key] = write.after
                    changes.append(_change(write.after, write.resource_version, deleted=False))
        for listener in list(self._listeners):
            try:
                listener(changes)
            except Exception:
                log.exception("an object-store listener failed")
        return changes

    def revert(self, writes: Sequence[StoreWrite]) -> None:
        """Undo writes whose events could not be logged (newest first)."""
        with self._lock:
            conn = self._require_conn()
            with _transaction(conn):
                for write in reversed(writes):
                    _restore(conn, write.key, write.before)

    def _require_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ObjectStoreError("the object store is not open")
        return self._conn

    def _apply_marks(self, conn: sqlite3.Connection) -> None:
        """Mark published writes as logged (tombstones are dropped): done lazily, in the next
        transaction, since a mark lost in a crash is recovered from the log."""
        for key in self._to_mark:
            conn.execute(
                "DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ? AND deleted = 1",
                key,
            )
            conn.execute(
                "UPDATE objects SET logged = 1, prev = NULL "
                "WHERE kind = ? AND namespace = ? AND name = ?",
                key,
            )
        self._to_mark.clear()

    # -------------------------------------------------------------- recovery

    def _recover(self, conn: sqlite3.Connection, last_event: LastEvent) -> None:
        """Settle what a crash left pending: logged changes stand, the others roll back."""
        pending = conn.execute(
            "SELECT kind, namespace, name, resource_version, deleted, prev FROM objects "
            "WHERE logged = 0"
        ).fetchall()
        if not pending:
            return
        kept = rolled = 0
        with _transaction(conn):
            for kind, namespace, name, rv, deleted, prev in pending:
                key: ObjectKey = (kind, namespace, name)
                expected = "ObjectDeleted" if deleted else "ObjectApplied"
                if last_event(key) == (expected, rv):
                    self._to_mark.add(key)
                    kept += 1
                else:
                    _restore_prev(conn, key, prev)
                    rolled += 1
            self._apply_marks(conn)
        log.warning(
            "object store: {} change(s) a stop left unconfirmed: {} in the event log (kept), "
            "{} not (rolled back)",
            kept + rolled,
            kept,
            rolled,
        )

    def _read_all(self, conn: sqlite3.Connection) -> Iterable[tuple[ObjectKey, StoredObject]]:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM objects WHERE deleted = 0").fetchall()
        for row in rows:
            stored = _from_row(row)
            if stored is not None:
                yield stored.key, stored


# ---------------------------------------------------------------- helpers


def _private_dir(directory: Path) -> None:
    """Create `directory` with mode 0700, or tighten an existing one to it."""
    try:
        directory.mkdir(mode=DIR_MODE, parents=False, exist_ok=True)
        mode = stat.S_IMODE(directory.stat().st_mode)
        if mode != DIR_MODE:
            log.warning("object store: {} had mode {:o}; set to {:o}", directory, mode, DIR_MODE)
            directory.chmod(DIR_MODE)
    except OSError as exc:
        raise ObjectStoreError(f"{directory}: cannot prepare the object store dir: {exc}") from None


def _private_file(path: Path) -> None:
    """Create `path` with mode 0600 before SQLite opens it (SQLite's WAL and shm take its
    mode), or tighten an existing one."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ObjectStoreError(f"{path}: cannot create the object store: {exc}") from None


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Any:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _with_resource_version(raw: Mapping[str, Any], rv: int) -> dict[str, Any]:
    out = dict(raw)
    meta = dict(out.get("metadata") or {})
    meta["resourceVersion"] = str(rv)
    out["metadata"] = meta
    return out


def _row(obj: StoredObject) -> tuple[Any, ...]:
    body = json.dumps(obj.raw, sort_keys=True, separators=(",", ":"))
    return (
        obj.kind,
        obj.namespace,
        obj.name,
        obj.uid,
        obj.resource_version,
        obj.content_hash,
        body,
        obj.created_us,
        obj.updated_us,
    )


def _prev(before: StoredObject | None) -> str | None:
    """The row a pending change replaces, kept to roll it back (None: there was none)."""
    return json.dumps(_row(before)) if before is not None else None


def _restore(conn: sqlite3.Connection, key: ObjectKey, before: StoredObject | None) -> None:
    _restore_prev(conn, key, _prev(before))


def _restore_prev(conn: sqlite3.Connection, key: ObjectKey, prev: str | None) -> None:
    conn.execute("DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?", key)
    if prev is not None:
        conn.execute(
            f"INSERT INTO objects ({_COLUMNS}, deleted, logged, prev) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 1, NULL)",
            tuple(json.loads(prev)),
        )


def _from_row(row: Sequence[Any]) -> StoredObject | None:
    kind, namespace, name, uid, rv, digest, body, created, updated = row
    raw = json.loads(body)
    try:
        obj = decode_object(raw, f"{kind} {namespace}/{name}")
    except InvalidObjectError as exc:
        log.error(
            "object store: {} {}/{} cannot be read back ({}); ignored",
            kind,
            namespace,
            name,
            exc.field,
        )
        return None
    return StoredObject(kind, namespace, name, uid, rv, digest, raw, obj, created, updated)


def _change(obj: StoredObject, rv: int, *, deleted: bool) -> ObjectChange:
    return ObjectChange(
        kind=obj.kind,
        namespace=obj.namespace,
        name=obj.name,
        uid=obj.uid,
        resource_version=rv,
        content_hash=obj.content_hash,
        deleted=deleted,
    )
