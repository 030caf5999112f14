"""Cluster-wide storage analytics: the aggregator, its store, reports, metrics and dashboard.

Modules: `tracking` (applied (node, seq) ranges), `store` (SQLite),
`ingest` (messages -> one store batch, NATS-free), `aggregator` (the
JetStream consumer), `report` (figures, JSON, tables), `metrics` (the
Prometheus collector), `export` (Parquet), `dashboard` (routes on
`volfsm.web` + the static page in `static/`), `cli` (`volfsm analytics
serve|report|export`). The pure part (rows, fold, figures) is
`projections.analytics`.
"""
