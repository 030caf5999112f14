"""Prefix property on a full lifecycle: folding the log cut at any seq gives the live state then.

The hypothesis state machine (tests/test_stateful.py) explores random command
sequences; this test complements it with the demo's long, realistic scenario
(stage timeouts, retries, shared volume, expansion, unstage failure, detach),
so every deep state is covered on every run.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from events.log import EventLog
from events.streams import device_stream, podvol_stream, stream_kind
from events.tables import TABLES
from events.types import PodAdded, PodRemoved
from projections.asof import state_at_seq, state_at_time
from projections.asw import Asw, fold
from volfsm.cli.demolog import build_scenario
from volfsm.engine.handler import CommandHandler

Snapshot = dict[str, tuple[str, int]]


def _trigger(stream: str, event_type: str) -> str:
    table = TABLES[stream_kind(stream)]
    return next(t.trigger for t in table.transitions if t.event == event_type)


def _asw_snapshot(asw: Asw) -> Snapshot:
    snap = {device_stream(v): (d.state, d.version) for v, d in asw.devices.items()}
    for (uid, name), pv in asw.podvols.items():
        snap[podvol_stream(uid, name)] = (pv.state, pv.version)
    return snap


class _Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_prefix_of_a_full_lifecycle_folds_to_the_live_state(
    tmp_path: Path, seed: int
) -> None:
    clock = _Clock()
    log = EventLog(tmp_path / "volfsm.db", clock=clock)
    handler = CommandHandler(log)
    live: dict[int, tuple[int, Snapshot, set[str]]] = {}
    streams: set[str] = set()
    pods: set[str] = set()
    try:
        for step in build_scenario(random.Random(seed)):
            clock.now += round(step.after_s * 1_000_000) + 1  # every step at its own time
            body = step.bodies[0]
            if step.transition:
                envs = handler.fire(step.stream, _trigger(step.stream, type(body).__name__), body)
            else:
                envs = handler.record(step.stream, step.bodies)
            if isinstance(body, PodAdded):
                pods.add(body.pod_uid)
            elif isinstance(body, PodRemoved):
                pods.discard(body.pod_uid)
            elif stream_kind(step.stream) not in ("pod", "object"):  # no state machine
                streams.add(step.stream)
            models = {s: handler.load(s) for s in streams}
            snap = {s: (m.state, m.version) for s, m in models.items()}
            live[envs[-1].seq] = (envs[-1].ts, snap, set(pods))
        envs_all = list(log.read_after(0))
    finally:
        log.close()
    assert len(live) == len(envs_all)
    for seq, (ts, snap, desired) in live.items():
        for asw in (
            fold(envs_all[:seq]),
            state_at_seq(envs_all, seq),
            state_at_time(envs_all, ts),
        ):
            got = _asw_snapshot(asw)
            for stream, entry in got.items():
                assert snap[stream] == entry, (seq, stream)
            for stream, (state, _v) in snap.items():
                if state != TABLES[stream_kind(stream)].initial:
                    assert stream in got, (seq, stream)
            assert set(asw.desired_pods) == desired, seq
            assert asw.last_seq == seq
