"""The SQLite store: a batch is all or nothing, state survives reopening, figures match memory."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest

from events.codec import envelope_to_json
from events.types import Envelope
from projections.analytics import report_of
from tests.analytics.feed import feed, report_from, without_publish_lag
from tests.analytics.scenario import NOW_US, node1, node2
from tests.analytics.sim import T0, SimNode, interleave, mixed_workload
from volfsm.analytics.ingest import Ingestor
from volfsm.analytics.store import AnalyticsStore, StoreError


def history() -> list[Envelope]:
    sims = [SimNode(f"s{i}") for i in range(3)]
    for i, sim in enumerate(sims):
        mixed_workload(sim, pods=40, seed=i)
    return interleave([node1(), node2(), *(s.envs for s in sims)])


@pytest.mark.parametrize("since_s", [None, 20.0])
def test_store_report_equals_the_in_memory_report(tmp_path: Path, since_s: float | None) -> None:
    envs = history()
    since = None if since_s is None else T0 + round(since_s * 1e6)
    with AnalyticsStore(tmp_path / "a.db") as store:
        feed(store, envs, batch=13)
    kwargs = {"since_us": since, "lag_threshold_s": 55.0, "stuck_threshold_s": 30.0}
    stored = report_from(tmp_path / "a.db", NOW_US, **kwargs)
    memory = report_of(envs, now_us=NOW_US, **kwargs)  # type: ignore[arg-type]
    assert without_publish_lag(stored) == without_publish_lag(memory)
    assert stored.events == (len(envs) if since is None else memory.events)


def test_open_state_survives_reopening_between_batches(tmp_path: Path) -> None:
    envs = history()
    path = tmp_path / "a.db"
    for start in range(0, len(envs), 50):  # a new process for every 50 events
        with AnalyticsStore(path) as store:
            ing = feed(store, envs[start : start + 50], batch=9)
            assert ing.stats.duplicates == 0
    with AnalyticsStore(tmp_path / "once.db") as store:
        feed(store, envs, batch=1000)
    assert without_publish_lag(report_from(path, NOW_US)) == without_publish_lag(
        report_from(tmp_path / "once.db", NOW_US)
    )


def test_redelivered_events_are_skipped(tmp_path: Path) -> None:
    envs = node1()
    with AnalyticsStore(tmp_path / "a.db") as store:
        feed(store, envs[:20])
        ing = feed(store, envs)  # 20 again, then the rest
        assert (ing.stats.applied, ing.stats.duplicates) == (len(envs) - 20, 20)
        assert store.counters().duplicates == 20
        assert store.count("events") == len(envs)


def test_a_batch_that_fails_leaves_nothing_behind(tmp_path: Path) -> None:
    envs = node1()
    with AnalyticsStore(tmp_path / "a.db") as store:
        feed(store, envs[:10])
        before = {t: store.count(t) for t in ("events", "op_samples", "open_ops", "applied")}
        ing = Ingestor(store, clock=lambda: T0)
        builder = ing.batch()
        for env in envs[10:15]:
            builder.add(envelope_to_json(env))
        batch = builder.finish()
        batch.rows.append(msgspec.structs.replace(batch.rows[0]))  # the same (node, seq) twice
        with pytest.raises(sqlite3.IntegrityError):
            store.commit(batch)
        assert {t: store.count(t) for t in before} == before
        assert store.load_state()[0].ranges == {"n1": [[1, 10]]}


def test_refuses_files_that_are_not_analytics_stores(tmp_path: Path) -> None:
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
        AnalyticsStore(tmp_path / "missing.db", read_only=True)
