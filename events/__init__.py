"""volfsm's vocabulary and durable log: event types, FSM tables, the SQLite log.

This package imports neither NATS, gRPC nor `transitions`: it is the bottom
layer that `projections` and `volfsm` build on.
"""
