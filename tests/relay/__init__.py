"""Tests of the outbox relay and the nats-server launcher, against real nats-server processes."""
