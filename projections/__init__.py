"""Pure folds over the event log: ASW, state as of a time, timelines, validation.

Imports only `events`; never `transitions`, NATS or gRPC.
"""
