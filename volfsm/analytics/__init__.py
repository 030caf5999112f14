"""Cluster-wide storage analytics: the aggregator, its store, reports, metrics and dashboard.

Modules: `tracking` (applied (node, seq) ranges), `columns` (the store's
tables as Arrow), `store` (Parquet partitions and their SQLite catalogs),
`query` (the report's aggregates in DuckDB), `ingest` (messages -> one
store batch, NATS-free), `fetch` (the pull fetch), `aggregator` (the
JetStream consumer), `partition` (ingest partitions of the stream),
`report` (figures, JSON, tables), `metrics` (the Prometheus collector),
`export` (one Parquet file), `migrate` and `legacy` (the SQLite store of
earlier versions), `dashboard` (routes on `volfsm.web` + the static page in
`static/`), `cli` (`volfsm analytics serve|report|export|partition|migrate`).
The pure part (rows, fold, figures) is `projections.analytics`.
"""
