"""volfsm: a node volume manager as an event-sourced state-machine service."""

__version__ = "0.1.0"
