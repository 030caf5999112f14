"""Three real volfsm nodes on a 3-server NATS JetStream cluster, an R3 stream, the aggregator.

The nodes (`volfsm serve`, each with its own data and root dirs and node
name, each connected to its own server of the cluster) run mixed emptyDir
workloads; the aggregator (`volfsm analytics serve`, a durable consumer on
the whole cluster) must end up with exactly the events of the three logs,
through: a SIGKILL of the aggregator and its restart, a SIGKILL of the
stream leader's server and its restart. A node that stops (SIGSTOP) shows
up as lagging; a real hole in a node's seq (a crafted event) is reported,
and it is the only gap ever noticed.

Every side runs in its role (deploy/nats/roles/): the admin creates the R3
stream with `volfsm stream create`, the nodes only check it
(`--stream-setup check`) and may touch only their own subjects, the
aggregator has its read-only role, the commands come with the client's.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.js import JetStreamContext
from typer.testing import CliRunner

from events.codec import envelope_to_json
from events.log import EventLog
from events.streams import pod_stream
from events.subjects import events_subject, msg_id, node_events_filter
from events.types import Envelope, PodAdded
from projections.analytics import ROW_COLUMNS, flatten, report_of
from tests.analytics.feed import report_from, without_publish_lag
from tests.cluster.conftest import Setup
from tests.cluster.harness import Commander, Node, Workload, wait_for
from tests.helpers.natsroles import (
    ADMIN,
    AGGREGATOR,
    CLIENT,
    cli_login,
    login,
    node_login,
    node_serve_args,
)
from tests.helpers.prometheus import sample
from volfsm.analytics.store import AnalyticsStore, StoreError
from volfsm.bus.cluster import NatsCluster
from volfsm.bus.roles import CLIENT_INBOX_PREFIX
from volfsm.cli import app

STREAM = "VOLFSM"
GHOST = "ghost"
GHOST_SEQS = (1, 2, 4)
"""The ghost node's events: seq 3 never comes, a real gap."""


def store_events(db: Path) -> int:
    """Events committed so far (0 before the store exists)."""
    try:
        with AnalyticsStore(db, read_only=True) as store:
            return store.event_count()
    except StoreError:
        return 0


def store_last_seq(db: Path, node: str) -> int:
    """The highest seq of `node` committed (0 if none)."""
    try:
        with AnalyticsStore(db, read_only=True) as store:
            return next((n.last_seq for n in store.nodes() if n.node == node), 0)
    except StoreError:
        return 0


def read_log(node: Node) -> list[Envelope]:
    """Every event of the node's log (read-only)."""
    log = EventLog(node.proc.data_dir / "volfsm.db", readonly=True)
    try:
        return list(log.read_after(0))
    finally:
        log.close()


def log_last_seq(node: Node) -> int:
    """The last seq of the node's log (read-only)."""
    log = EventLog(node.proc.data_dir / "volfsm.db", readonly=True)
    try:
        return log.last_seq()
    finally:
        log.close()


async def pause_when_all_stored(node: Node, db: Path) -> None:
    """SIGSTOP `node` at a moment the store holds every event of its log.

    An event logged but not yet published when the node stops would never
    arrive; so pause, check, and resume and try again if one slipped in.
    """
    for _ in range(20):
        await wait_for(
            f"{node.name}'s events in the store",
            lambda: store_last_seq(db, node.name) == log_last_seq(node),
        )
        node.pause()
        if await asyncio.to_thread(lambda: store_last_seq(db, node.name) == log_last_seq(node)):
            return
        node.resume()
    pytest.fail(f"{node.name} kept logging events")


async def new_leader(cluster: NatsCluster, js: JetStreamContext, old: str) -> str:
    """Wait until the stream has a leader other than `old`; its name."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    while loop.time() < deadline:
        try:
            leader = await cluster.stream_leader(js, STREAM)
        except (nats.errors.Error, TimeoutError):
            leader = None
        if leader is not None and leader != old:
            return leader
        await asyncio.sleep(0.2)
    pytest.fail(f"no new leader of {STREAM} after {old} was killed")


def ghost_envelope(seq: int) -> Envelope:
    """A crafted event of node `ghost` (a pod without volumes: it changes no other figure)."""
    uid = f"ghost-pod-{seq}"
    body = PodAdded(pod_uid=uid, namespace="default", name=uid)
    return Envelope(
        seq=seq,
        stream=pod_stream(uid),
        version=1,
        type="PodAdded",
        schema=PodAdded.SCHEMA,
        ts=time.time_ns() // 1000,
        node=GHOST,
        body=body,
    )


async def publish_ghost(js: JetStreamContext) -> None:
    """Publish the ghost's events as a relay would, skipping seq 3."""
    for seq in GHOST_SEQS:
        env = ghost_envelope(seq)
        await js.publish(
            events_subject(GHOST, env.type),
            envelope_to_json(env),
            headers={"Nats-Msg-Id": msg_id(GHOST, seq)},
        )


def create_stream(url: str) -> None:
    """`volfsm stream create --replicas 3` with the admin credential."""
    made = CliRunner().invoke(
        app, ["stream", "create", "--nats", url, "--replicas", "3", *cli_login(ADMIN)]
    )
    assert made.exit_code == 0, made.output


async def publish_as_ghost(urls: list[str]) -> None:
    """The ghost's events, published with the ghost node's own role."""
    nc = await nats.connect(servers=urls, **node_login(GHOST))
    try:
        await publish_ghost(nc.jetstream())
    finally:
        await nc.close()


def op_counts(rows: list[tuple[object, ...]]) -> Counter[tuple[object, ...]]:
    """(node, type, operation, code, final) -> how many."""
    return Counter(rows)


async def test_three_nodes_r3_stream_exact_through_leader_and_aggregator_crashes(
    setup: Setup,
) -> None:
    cluster = setup.cluster
    names = [f"n{i + 1}" for i in range(3)]
    nodes = [setup.node(n, cluster.urls[i], *node_serve_args(n)) for i, n in enumerate(names)]
    by_name = {n.name: n for n in nodes}
    # Arrange: the admin creates the R3 stream; the aggregator, then the nodes
    # (each on its own server), each in its role
    await asyncio.to_thread(create_stream, cluster.url)
    db = setup.base / "analytics.db"
    agg = setup.aggregator(db, "--batch", "20", "--lag-threshold", "3", *cli_login(AGGREGATOR))
    agg.start()
    for node in nodes:
        node.proc.start(wait_ready=False)
    for node in nodes:
        await asyncio.to_thread(node.proc.wait_ready, 90)
    cmd = await Commander.connect(cluster.urls, **login(CLIENT), inbox_prefix=CLIENT_INBOX_PREFIX)
    admin = await nats.connect(
        servers=cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2, **login(ADMIN)
    )
    try:
        js = admin.jetstream()
        info = await js.stream_info(STREAM)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2
        for node in nodes:
            await cmd.declare_complete(node.name)
        work = {n.name: Workload(cmd, n) for n in nodes}

        # Act 1: a first round of mixed pods on every node
        await asyncio.gather(*(w.run("r1", 4) for w in work.values()))

        # Act 2: the aggregator is SIGKILLed while it ingests a second round
        def everywhere(tag: str, pods: int) -> asyncio.Future[list[None]]:
            return asyncio.ensure_future(asyncio.gather(*(w.run(tag, pods) for w in work.values())))

        before = store_events(db)
        round2 = everywhere("r2", 4)
        await wait_for("commits of round 2", lambda: store_events(db) >= before + 20, 90, agg.tail)
        agg.kill()
        await round2

        # Act 3: the server leading the stream crashes; while it is down a new
        # leader takes over, the aggregator restarts and every node runs more pods
        # (the node on the dead server keeps its events in its log meanwhile);
        # then the server comes back on its ports and store, and a last round
        leader = await cluster.stream_leader(js, STREAM)
        assert leader is not None
        cluster.kill(leader)
        await new_leader(cluster, js, leader)
        agg.start()
        await everywhere("r3", 4)
        [stranded] = [n for n in nodes if n.proc.nats_url == cluster.member(leader).url]
        status = await cmd.request(stranded.name, "get", {"what": "pods"})
        assert status["publish_lag"] > 0 and status["relay"]["connected"] is False, status
        cluster.member(leader).server.start()  # from this thread: it dies with it
        await wait_for(f"{leader} healthy again", cluster.member(leader).healthy)
        await everywhere("r4", 4)

        # Act 4: n3 stops (SIGSTOP) while n1 and n2 keep writing events (pods whose
        # mount fails and is retried)
        for name in ("n1", "n2"):
            await work[name].apply(f"{name}-beat", "blocked")
        n3 = by_name["n3"]
        await pause_when_all_stored(n3, db)

        def lag_shown() -> bool:
            doc = agg.report()
            lagging = {n["node"]: n["lagging"] for n in (doc or {}).get("nodes", [])}
            return lagging == {"n1": False, "n2": False, "n3": True}

        await wait_for("n3 lagging, n1 and n2 not", lag_shown, 90, lambda: str(agg.report()))
        metrics = await asyncio.to_thread(agg.metrics)
        assert sample(metrics, "volfsm_analytics_node_lagging", node="n3") == 1
        n3.resume()
        for name in ("n1", "n2"):
            await work[name].unblock(f"{name}-beat")
            await work[name].finish(f"{name}-beat")

        # Act 5: a gap in a node's seq
        await publish_as_ghost(cluster.urls)
        want_gap = [{"node": GHOST, "from_seq": 3, "to_seq": 3, "missing": 1}]
        await wait_for(
            "the ghost's gap reported",
            lambda: (agg.report() or {}).get("gaps") == want_gap,
            90,
            lambda: str((agg.report() or {}).get("gaps")),
        )
        metrics = await asyncio.to_thread(agg.metrics)
        assert sample(metrics, "volfsm_analytics_seq_gaps", node="ghost") == 1

        # Act 6: a last round everywhere, then the nodes drain and exit
        await everywhere("r5", 2)
        codes = [await asyncio.to_thread(n.stop) for n in nodes]
        assert codes == [0, 0, 0], [n.proc.stderr_tail() for n in nodes]
        logs = {n.name: await asyncio.to_thread(read_log, n) for n in nodes}
        for name, envs in logs.items():
            held = await js.stream_info(STREAM, subjects_filter=node_events_filter(name))
            assert sum((held.state.subjects or {}).values()) == len(envs)
    finally:
        await cmd.close()
        await admin.close()
    total = sum(len(e) for e in logs.values())
    await wait_for(
        "every event in the store",
        lambda: store_events(db) == total + len(GHOST_SEQS),
        120,
        agg.tail,
    )
    assert agg.stop() == 0, agg.tail()

    # Assert: the workloads really were mixed
    assert all(w.cycles == 4 * 4 + 2 + (n in ("n1", "n2")) for n, w in work.items())
    rows = [flatten(env) for envs in logs.values() for env in envs]
    assert {r.type for r in rows} >= {"VolumeMounted", "OperationFailed", "DeviceDetached"}

    # Assert: exactly the logs' events, once each; the ghost's gap is the only one noticed
    with AnalyticsStore(db, read_only=True) as store:
        stored = [row for chunk in store.iter_events() for row in chunk]
        counters = store.counters()
        gap_log = [(n, lo, hi) for n, lo, hi, _ in store.gap_log()]
        per_node = {n.node: n.events for n in store.nodes()}
    col = {name: i for i, name in enumerate(ROW_COLUMNS)}
    keys = [(r[col["node"]], r[col["seq"]]) for r in stored]
    assert len(keys) == len(set(keys))
    assert set(keys) == {(r.node, r.seq) for r in rows} | {(GHOST, s) for s in GHOST_SEQS}
    stored_ops = [
        (
            r[col["node"]],
            r[col["type"]],
            r[col["operation"]],
            r[col["code"]],
            None if r[col["final"]] is None else bool(r[col["final"]]),
        )
        for r in stored
        if r[col["node"]] != GHOST
    ]
    assert per_node == {**{name: len(e) for name, e in logs.items()}, GHOST: len(GHOST_SEQS)}
    assert op_counts(stored_ops) == op_counts(
        [(r.node, r.type, r.operation, r.code, r.final) for r in rows]
    )
    assert gap_log == [(GHOST, 3, 3)]
    assert (counters.applied, counters.undecodable, counters.gaps_noticed) == (
        total + len(GHOST_SEQS),
        0,
        1,
    )

    # Assert: the whole report equals the one computed from the three logs in memory
    now = max(r.ts_us for r in rows) + 1_000_000
    got = without_node(without_publish_lag(report_from(db, now)), GHOST, len(GHOST_SEQS))
    expected = report_of([env for envs in logs.values() for env in envs], now_us=now)
    assert got == without_publish_lag(expected)


def without_node(doc: dict[str, Any], node: str, events: int) -> dict[str, Any]:
    """A report document without `node` (its `events` taken off the total)."""
    doc["nodes"] = [n for n in doc["nodes"] if n["node"] != node]
    doc["gaps"] = [g for g in doc["gaps"] if g["node"] != node]
    doc["events"] -= events
    return doc
