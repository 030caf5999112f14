"""The store: a batch is all or nothing, state survives reopening, compaction into Parquet keeps
every row once, reports read only the window's files and match the in-memory report."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import msgspec
import pytest

from events.codec import envelope_to_json
from events.types import Envelope
from projections.analytics import ROW_COLUMNS, report_of
from tests.analytics.feed import feed, report_from, without_publish_lag
from tests.analytics.scenario import NOW_US, node1, node2
from tests.analytics.sim import T0, SimNode, interleave, mixed_workload
from volfsm.analytics import store as storage
from volfsm.analytics.ingest import Ingestor
from volfsm.analytics.legacy import SQLiteStore
from volfsm.analytics.migrate import migrate
from volfsm.analytics.store import AnalyticsStore, Batch, DuplicateRowError, StoreError

DAY_US = 86_400_000_000


def history() -> list[Envelope]:
    sims = [SimNode(f"s{i}") for i in range(3)]
    for i, sim in enumerate(sims):
        mixed_workload(sim, pods=40, seed=i)
    return interleave([node1(), node2(), *(s.envs for s in sims)])


def three_days() -> list[Envelope]:
    """Two nodes, a mixed workload on each of three days (T0's day and the two after)."""
    sims = [SimNode(f"d{i}") for i in range(2)]
    for day in range(3):
        for i, sim in enumerate(sims):
            sim.now_us = max(sim.now_us, T0 + day * DAY_US)
            mixed_workload(sim, pods=15, seed=10 * day + i)
    return interleave([s.envs for s in sims])


@pytest.mark.parametrize(
    ("since_s", "until_s"), [(None, None), (20.0, None), (None, 30.0), (10.0, 40.0)]
)
def test_store_report_equals_the_in_memory_report(
    tmp_path: Path, since_s: float | None, until_s: float | None
) -> None:
    envs = history()
    since = None if since_s is None else T0 + round(since_s * 1e6)
    until = None if until_s is None else T0 + round(until_s * 1e6)
    with AnalyticsStore(tmp_path / "a", compact_rows=700) as store:
        feed(store, envs, batch=13)  # compacted several times on the way, hot rows left
    kwargs = {
        "since_us": since,
        "until_us": until,
        "lag_threshold_s": 55.0,
        "stuck_threshold_s": 30.0,
        "top": 7,
    }
    stored = report_from(tmp_path / "a", NOW_US, **kwargs)
    memory = report_of(envs, now_us=NOW_US, **kwargs)  # type: ignore[arg-type]
    assert without_publish_lag(stored) == without_publish_lag(memory)
    assert len(stored.uncertain_volumes) == 7 < stored.uncertain_volumes_total
    assert stored.events == (len(envs) if since is until is None else memory.events)


def test_percentiles_of_many_group_sizes_match_nearest_rank(tmp_path: Path) -> None:
    sims = [SimNode(f"p{i}") for i in range(12)]
    for i, sim in enumerate(sims):
        mixed_workload(sim, pods=1 + 23 * i, seed=100 + i)  # groups of 1 to ~400 operations
    for i, sim in enumerate(sims):
        envs = sim.envs
        with AnalyticsStore(tmp_path / f"p{i}") as store:
            feed(store, envs, batch=500)
        stored = report_from(tmp_path / f"p{i}", NOW_US)
        assert stored.latency == report_of(envs, now_us=NOW_US).latency
        assert stored.pod_ready == report_of(envs, now_us=NOW_US).pod_ready


def test_compaction_moves_every_row_into_day_partitions_once(tmp_path: Path) -> None:
    envs = three_days()
    root = tmp_path / "a"
    with AnalyticsStore(root, compact_rows=10**9) as store:
        feed(store, envs, batch=50)
        before = without_publish_lag(report_from(root, NOW_US + 3 * DAY_US))
        snap = store.snapshot()
        assert snap.files == [] and sum(len(b) for b in snap.hot.values()) > 0
        written = store.compact()
        snap = store.snapshot()
        assert snap.hot == {} and len(snap.files) == written
        assert store.count("events") == len(envs)
    days = sorted(p.name for p in (root / "events").iterdir())
    assert days == ["day=2023-11-14", "day=2023-11-15", "day=2023-11-16"]
    assert all((root / "events" / d / "part=0").is_dir() for d in days)
    assert without_publish_lag(report_from(root, NOW_US + 3 * DAY_US)) == before


def test_since_and_until_read_only_the_files_of_the_window(tmp_path: Path) -> None:
    envs = three_days()
    root = tmp_path / "a"
    with AnalyticsStore(root) as store:
        feed(store, envs, batch=50)
        store.compact()
    now = T0 + 3 * DAY_US
    first_day = [
        path
        for table in ("events", "samples", "spans", "ready")
        for path in root.glob(f"{table}/day=2023-11-14/*/*.parquet")
    ]
    assert len(first_day) == 4
    for path in first_day:  # the first day's files become unreadable
        path.write_bytes(b"not parquet any more")
    since = T0 + DAY_US  # the second day's workload, not the third's
    until = since + DAY_US // 2
    stored = report_from(root, now, since_us=since, until_us=until)
    assert without_publish_lag(stored) == without_publish_lag(
        report_of(envs, now_us=now, since_us=since, until_us=until)
    )
    assert stored.events > 0
    with pytest.raises(Exception, match=r"(?i)parquet"):
        report_from(root, now)  # the whole history reads the first day: proof it was skipped


def test_files_a_compaction_left_unlisted_are_removed_on_the_next_open(tmp_path: Path) -> None:
    envs = history()
    root = tmp_path / "a"
    with AnalyticsStore(root) as store:
        feed(store, envs, batch=50)
        catalog = store._catalogs[0][2].conn
        catalog.execute(
            "CREATE TEMP TRIGGER no_delete BEFORE DELETE ON hot BEGIN "
            "SELECT RAISE(ABORT, 'crash before the catalog commit'); END"
        )
        with pytest.raises(sqlite3.IntegrityError, match="crash before"):
            store.compact()
        orphans = sorted(root.glob("*/day=*/part=0/*.parquet"))
        assert orphans and store.snapshot().files == []
    with AnalyticsStore(root) as store:  # the next writer of the partition
        assert sorted(root.glob("*/day=*/part=0/*.parquet")) == []
        assert store.count("events") == len(envs)
        store.compact()
        assert store.count("events") == len(envs)
    expected = report_of(envs, now_us=NOW_US)
    assert without_publish_lag(report_from(root, NOW_US)) == without_publish_lag(expected)


def test_files_that_are_not_the_stores_own_are_never_deleted(tmp_path: Path) -> None:
    """A store is made only in a new or empty dir; in its own dirs it deletes only its files."""
    lake = tmp_path / "lake"  # someone's hive-partitioned data, given as --db by mistake
    theirs = lake / "events" / "day=2024-05-01" / "part=0" / "data.parquet"
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(b"their bytes")
    with pytest.raises(StoreError, match="not a volfsm analytics store, and not empty"):
        AnalyticsStore(lake)
    assert theirs.read_bytes() == b"their bytes"
    assert not (lake / storage.CATALOG_DIR).exists()
    root = tmp_path / "a"
    with AnalyticsStore(root) as store:
        feed(store, history()[:50], batch=50)
    stray = root / "events" / "day=2024-05-01" / "part=0" / "notes.txt"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"kept")
    with AnalyticsStore(root):  # the next writer sweeps unlisted files: only its own names
        pass
    assert stray.read_bytes() == b"kept"


def test_open_state_survives_reopening_between_batches(tmp_path: Path) -> None:
    envs = history()
    path = tmp_path / "a"
    for start in range(0, len(envs), 50):  # a new process for every 50 events
        with AnalyticsStore(path, compact_rows=120) as store:
            ing = feed(store, envs[start : start + 50], batch=9)
            assert ing.stats.duplicates == 0
    with AnalyticsStore(tmp_path / "once") as store:
        feed(store, envs, batch=1000)
    assert without_publish_lag(report_from(path, NOW_US)) == without_publish_lag(
        report_from(tmp_path / "once", NOW_US)
    )


def test_redelivered_events_are_skipped(tmp_path: Path) -> None:
    envs = node1()
    with AnalyticsStore(tmp_path / "a") as store:
        feed(store, envs[:20])
        ing = feed(store, envs)  # 20 again, then the rest
        assert (ing.stats.applied, ing.stats.duplicates) == (len(envs) - 20, 20)
        assert store.counters().duplicates == 20
        assert store.count("events") == len(envs)


def test_a_batch_that_fails_leaves_nothing_behind(tmp_path: Path) -> None:
    envs = node1()
    with AnalyticsStore(tmp_path / "a") as store:
        feed(store, envs[:10])
        before = {t: store.count(t) for t in ("events", "samples", "spans", "ready")}
        state = store.snapshot().state
        ing = Ingestor(store, clock=lambda: T0)
        builder = ing.batch()
        for env in envs[10:15]:
            builder.add(envelope_to_json(env))
        batch = builder.finish()
        twice = msgspec.structs.replace(batch.rows[0])
        batch.rows.append(twice)  # the same (node, seq) twice
        with pytest.raises(DuplicateRowError):
            store.commit(batch)
        batch.rows.remove(twice)
        batch.gaps.append(("n1", 1))  # type: ignore[arg-type]  # fails after the rows went in
        with pytest.raises(sqlite3.ProgrammingError):
            store.commit(batch)
        assert {t: store.count(t) for t in before} == before
        assert store.snapshot().state == state
        assert store.load_state()[0].ranges == {"n1": [[1, 10]]}


def test_one_writer_per_partition(tmp_path: Path) -> None:
    with AnalyticsStore(tmp_path / "a"), pytest.raises(StoreError, match="another process"):
        AnalyticsStore(tmp_path / "a")
    with pytest.raises(StoreError, match="partition 0 of 1, not of 3"):
        AnalyticsStore(tmp_path / "a", partition=1, partitions=3)


def test_refuses_what_is_not_a_store(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('format', 'something-else')")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a volfsm analytics store"):
        AnalyticsStore(other)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError):
        AnalyticsStore(junk, read_only=True)
    with pytest.raises(StoreError, match="no analytics store"):
        AnalyticsStore(tmp_path / "missing", read_only=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="no analytics store"):
        AnalyticsStore(tmp_path / "empty", read_only=True)


def test_an_old_store_is_refused_with_how_to_migrate_and_migrates_exactly(
    tmp_path: Path,
) -> None:
    envs = history()
    old = tmp_path / "old.db"
    with SQLiteStore(old) as legacy:
        feed(legacy, envs[:-30], batch=11)  # type: ignore[arg-type]
        feed(legacy, envs[-60:], batch=11)  # type: ignore[arg-type]  # 30 redelivered
    digest = hashlib.sha256(old.read_bytes()).hexdigest()
    for read_only in (False, True):
        with pytest.raises(StoreError, match="volfsm analytics migrate --from"):
            AnalyticsStore(old, read_only=read_only)

    result = migrate(old, tmp_path / "new")
    assert (result.events, result.nodes) == (len(envs), 5)
    assert hashlib.sha256(old.read_bytes()).hexdigest() == digest  # only read
    expected = report_of(envs, now_us=NOW_US)
    assert without_publish_lag(report_from(tmp_path / "new", NOW_US)) == without_publish_lag(
        expected
    )
    with (
        AnalyticsStore(tmp_path / "new", read_only=True) as store,
        SQLiteStore(old, read_only=True) as legacy,
    ):
        assert store.counters() == legacy.counters()
        assert store.snapshot().seq_ranges().ranges == legacy.load_state()[0].ranges
        rows = [tuple(r) for chunk in store.iter_events() for r in chunk]
        flags = [ROW_COLUMNS.index("final"), ROW_COLUMNS.index("reconstructed")]
        old_rows = []
        for chunk in legacy.iter_events():
            for r in chunk:
                row = list(r)
                for i in flags:  # SQLite kept booleans as integers
                    row[i] = None if row[i] is None else bool(row[i])
                old_rows.append(tuple(row))
        assert rows == old_rows
    with pytest.raises(StoreError, match="not a new or empty directory"):
        migrate(old, tmp_path / "new")

    with AnalyticsStore(tmp_path / "new") as store:  # and ingest goes on from there
        ing = feed(store, envs[-5:])
        assert (ing.stats.applied, ing.stats.duplicates) == (0, 5)


def test_small_files_of_a_day_are_merged_and_deleted_after_a_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs = history()
    root = tmp_path / "a"
    with AnalyticsStore(root, compact_rows=100) as store:
        feed(store, envs[: len(envs) // 2], batch=50)  # a compaction every two batches
        before = store.snapshot()  # a reader's snapshot, taken before more merges
        feed(store, envs[len(envs) // 2 :], batch=50)
        files = store.snapshot().files
        assert len([f for f in files if f.table == "events"]) < storage.MERGE_FILES
        retired = [f.path for f in before.files if f not in files]
        assert retired and all(p.exists() for p in retired)  # still readable by `before`
        assert without_publish_lag(report_from(root, NOW_US)) == without_publish_lag(
            report_of(envs, now_us=NOW_US)
        )
        monkeypatch.setattr(storage, "RETIRE_AFTER_S", 0.0)
        store.commit(store_batch(store, []))
        store.compact()
        listed = {f.path for f in store.snapshot().files}
    assert not any(p.exists() for p in retired)
    assert set(root.glob("*/day=*/part=0/*.parquet")) == listed


def store_batch(store: AnalyticsStore, envs: list[Envelope]) -> Batch:
    """A batch of `envs` on top of the store's committed state."""
    builder = Ingestor(store, clock=lambda: T0).batch()
    for env in envs:
        builder.add(envelope_to_json(env))
    return builder.finish()
