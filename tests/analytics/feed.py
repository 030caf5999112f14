"""Feeding envelopes into an analytics store without NATS, batch by batch, like the aggregator."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec

from events.codec import envelope_to_json
from events.types import Envelope
from projections.analytics import Report
from tests.analytics.sim import T0
from volfsm.analytics.ingest import Ingestor
from volfsm.analytics.report import ReportOptions, store_report
from volfsm.analytics.store import AnalyticsStore


def feed(store: AnalyticsStore, envs: Sequence[Envelope], batch: int = 7) -> Ingestor:
    """Apply `envs` (in this order) in batches of `batch`, each one committed."""
    ing = Ingestor(store, clock=lambda: T0)
    for start in range(0, len(envs), batch):
        builder = ing.batch()
        for env in envs[start : start + batch]:
            builder.add(envelope_to_json(env))
        store.commit(builder.finish())
    return ing


def report_from(path: Path, now_us: int, **options: object) -> Report:
    """The report of the store at `path`, read through a read-only connection."""
    with AnalyticsStore(path, read_only=True) as store:
        return store_report(store, ReportOptions(**options), now_us=now_us)  # type: ignore[arg-type]


def without_publish_lag(report: Report) -> dict[str, object]:
    """The report as data, publish lag (stream timing) left out."""
    doc = msgspec.to_builtins(report)
    for node in doc["nodes"]:
        node["publish_lag_s"] = 0.0
    return doc  # type: ignore[no-any-return]
