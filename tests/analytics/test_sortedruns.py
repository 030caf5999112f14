"""Sorted-duration sidecars: exact percentiles from several files' runs, the same report with or
without them, a report over whole files reads their sidecars and not their rows, and a sidecar
lives and dies with its Parquet file."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from events.types import Envelope
from projections.analytics import percentile, report_of
from tests.analytics.feed import feed, report_from, without_publish_lag
from tests.analytics.scenario import NOW_US
from tests.analytics.sim import T0, SimNode, interleave, mixed_workload
from volfsm.analytics import store as storage
from volfsm.analytics.ingest import Ingestor
from volfsm.analytics.sortedruns import SUFFIX, percentiles
from volfsm.analytics.store import AnalyticsStore


def fleet(nodes: int, pods: int, prefix: str = "r") -> list[Envelope]:
    sims = [SimNode(f"{prefix}{i}") for i in range(nodes)]
    for i, sim in enumerate(sims):
        mixed_workload(sim, pods=pods + 17 * i, seed=300 + i)
    return interleave([s.envs for s in sims])


def sidecars(root: Path) -> set[Path]:
    return set(root.glob(f"*/day=*/part=0/*{SUFFIX}"))


def test_percentiles_of_sorted_runs_are_nearest_rank() -> None:
    rng = random.Random(7)
    for size in [*range(1, 60), 257, 1000]:
        values = [rng.randint(0, 50) if size % 2 else rng.randint(0, 10**7) for _ in range(size)]
        cut = sorted(rng.sample(range(size + 1), min(size + 1, rng.randint(0, 6))))
        parts = [values[a:b] for a, b in zip([0, *cut], [*cut, size], strict=True)]
        arrays = [np.array(sorted(p), np.int64) for p in parts if p]
        expected = [percentile(sorted(values), p) for p in (50, 90, 99)]
        assert percentiles(arrays, (50, 90, 99)) == expected


@pytest.mark.parametrize(("since_s", "until_s"), [(None, None), (15.0, 45.0)])
def test_report_from_sidecars_of_many_files_equals_the_in_memory_report(
    tmp_path: Path, since_s: float | None, until_s: float | None
) -> None:
    envs = fleet(4, 30)
    root = tmp_path / "a"
    with AnalyticsStore(root, compact_rows=400) as store:
        feed(store, envs, batch=40)  # many files, each with its sidecar; hot rows left
        files = [f for f in store.snapshot().files if f.table in ("samples", "ready")]
    assert len(files) > 4
    assert {f.path.with_name(f.path.stem + SUFFIX) for f in files} <= sidecars(root)
    window = {
        "since_us": None if since_s is None else T0 + round(since_s * 1e6),
        "until_us": None if until_s is None else T0 + round(until_s * 1e6),
    }
    stored = report_from(root, NOW_US, **window)
    memory = report_of(envs, now_us=NOW_US, **window)  # type: ignore[arg-type]
    assert without_publish_lag(stored) == without_publish_lag(memory)
    assert stored.latency_series and stored.pod_ready.count


def test_a_store_without_sidecars_reports_the_same(tmp_path: Path) -> None:
    """Files written before sidecars existed are read as rows."""
    envs = fleet(3, 25)
    root = tmp_path / "a"
    with AnalyticsStore(root, compact_rows=500) as store:
        feed(store, envs, batch=50)
    removed = sidecars(root)
    assert removed
    for path in removed:
        path.unlink()
    assert without_publish_lag(report_from(root, NOW_US)) == without_publish_lag(
        report_of(envs, now_us=NOW_US)
    )


def test_a_sidecar_is_kept_and_removed_with_its_parquet_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs = fleet(3, 25)
    root = tmp_path / "a"
    with AnalyticsStore(root, compact_rows=10**9) as store:
        feed(store, envs[:300], batch=50)
        store.compact()
        kept = sidecars(root)
        feed(store, envs[300:], batch=50)
        catalog = store._catalogs[0][2].conn
        catalog.execute(
            "CREATE TEMP TRIGGER no_delete BEFORE DELETE ON hot BEGIN "
            "SELECT RAISE(ABORT, 'crash before the catalog commit'); END"
        )
        with pytest.raises(sqlite3.IntegrityError, match="crash before"):
            store.compact()
        assert sidecars(root) > kept  # the cut-short compaction's sidecars, listed nowhere
    stray = next(iter(kept)).with_name(f"notes{SUFFIX}")  # not a name the store gives
    stray.write_bytes(b"kept")
    with AnalyticsStore(root, compact_rows=100) as store:  # the next writer sweeps
        assert sidecars(root) == kept | {stray}
        feed(store, fleet(2, 20, "m"), batch=50)  # small files, merged; merged ones retired
        assert store._writer.conn.execute("SELECT count(*) FROM retired").fetchone()[0]
        monkeypatch.setattr(storage, "RETIRE_AFTER_S", 0.0)
        store.commit(Ingestor(store, clock=lambda: T0).batch().finish())
        store.compact()
        listed = {f.path for f in store.snapshot().files if f.table in ("samples", "ready")}
    own = sidecars(root) - {stray}
    assert {p.with_name(p.name.removesuffix(SUFFIX) + ".parquet") for p in own} == listed
    assert stray.read_bytes() == b"kept"


def test_a_report_over_whole_files_reads_no_operation_or_readiness_rows(tmp_path: Path) -> None:
    envs = fleet(3, 25)
    root = tmp_path / "a"
    with AnalyticsStore(root, compact_rows=500) as store:
        feed(store, envs, batch=50)
        store.compact()  # nothing hot
    for table in ("samples", "ready"):
        for path in root.glob(f"{table}/day=*/part=0/*.parquet"):
            path.write_bytes(b"not parquet any more")  # only their sidecars stay readable
    assert without_publish_lag(report_from(root, NOW_US)) == without_publish_lag(
        report_of(envs, now_us=NOW_US)
    )
