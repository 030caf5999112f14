"""Hand-built envelopes for projection tests: seq and versions assigned, time set explicitly."""

from __future__ import annotations

from dataclasses import dataclass, field

from events.types import Body, Envelope

T0 = 1_700_000_000_000_000
"""A fixed start time (UTC µs) for hand-built histories."""


@dataclass
class History:
    """Appends envelopes like the log would: global seq, per-stream version, given time."""

    envs: list[Envelope] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)

    def add(self, seconds: float, stream: str, body: Body) -> Envelope:
        """Append `body` to `stream` stamped T0 + `seconds`."""
        version = self.versions.get(stream, 0) + 1
        self.versions[stream] = version
        env = Envelope(
            seq=len(self.envs) + 1,
            stream=stream,
            version=version,
            type=type(body).__name__,
            schema=type(body).SCHEMA,
            ts=T0 + round(seconds * 1_000_000),
            node="test-node",
            body=body,  # type: ignore[arg-type]
        )
        self.envs.append(env)
        return env


def raw(
    seq: int, stream: str, version: int, body: Body, ts: int = T0, type_name: str = ""
) -> Envelope:
    """One envelope with every field given (to build broken logs)."""
    return Envelope(
        seq=seq,
        stream=stream,
        version=version,
        type=type_name or type(body).__name__,
        schema=type(body).SCHEMA,
        ts=ts,
        node="test-node",
        body=body,  # type: ignore[arg-type]
    )
