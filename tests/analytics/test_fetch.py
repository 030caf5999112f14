"""The aggregator's pull fetch against a real nats-server: what `PullSubscription.fetch` returns."""

from __future__ import annotations

import asyncio

import pytest
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import APIError

from tests.analytics.sim import STREAM, SimNode, mixed_workload, publish
from volfsm.analytics.fetch import fetch


async def consumer(js: JetStreamContext, name: str) -> JetStreamContext.PullSubscription:
    config = ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=-1)
    return await js.pull_subscribe("volfsm.*.events.>", durable=name, config=config)


async def test_fetch_returns_what_nats_py_fetch_returns(js: JetStreamContext) -> None:
    sim = SimNode("node-a")
    mixed_workload(sim, pods=30, seed=3)
    await publish(js, sim.envs)
    ours, theirs = await consumer(js, "ours"), await consumer(js, "theirs")
    got: list[list[int]] = [[], []]
    for batch in (1, 7, 100, 1000):
        mine = await fetch(ours, batch, 1.0)
        other = await theirs.fetch(batch, timeout=1.0)
        assert len(mine) == len(other) == min(batch, len(sim.envs) - len(got[0]))
        got[0] += [m.metadata.sequence.stream for m in mine]
        got[1] += [m.metadata.sequence.stream for m in other]
        if len(got[0]) == len(sim.envs):
            break
    assert got[0] == got[1] == list(range(1, len(sim.envs) + 1))

    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await fetch(ours, 100, 0.3) == []  # drained: empty after the timeout, no error
    assert loop.time() - start < 5
    later = SimNode("node-b")
    mixed_workload(later, pods=1, seed=4)
    await publish(js, later.envs)
    assert len(await fetch(ours, 1000, 1.0)) == len(later.envs)  # a lingering request is served


async def test_fetch_raises_when_the_consumer_is_gone(js: JetStreamContext) -> None:
    sim = SimNode("node-a")
    mixed_workload(sim, pods=1, seed=3)
    await publish(js, sim.envs)
    ours = await consumer(js, "gone")
    await js.delete_consumer(STREAM, "gone")
    with pytest.raises(APIError):
        for _ in range(3):
            await fetch(ours, 10, 0.5)
