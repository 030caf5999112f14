"""Pure folds over the event log: ASW, state as of a time, timelines, validation.

Modules: `asw` (actual state of world), `asof` (state at a seq or a time),
`timeline` (per-volume / per-pod state segments and operation marks),
`validate` (replay validator), `history` (event selection), `export`
(ndjson), `diagram` (mermaid from the tables), `pending` (pods' waits for their
claims, and their wording, shared by state, timeline, diff and replay).

Imports only `events`; never `transitions`, NATS or gRPC.
"""
