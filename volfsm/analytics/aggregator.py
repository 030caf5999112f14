"""The aggregator: a durable JetStream pull consumer over every node's events, applied exactly once.

Each fetched batch is flattened, checked against the applied (node, seq)
ranges, folded, and committed to the store in one transaction; only then is
the batch acknowledged (AckPolicy.ALL: one ack covers the batch). A crash
before the commit loses nothing (JetStream redelivers); a crash after the
commit but before the ack causes redeliveries that the ranges recognise.

Gaps: an event whose seq lies past its node's last applied seq + 1 opens a
hole; it is logged, recorded with the time it was noticed, and reported
until the missing events arrive. A node's first event sets where its
sequence starts, so starting mid-stream (by time) reports no gap.

Where a run starts: the durable consumer keeps its place across restarts.
A consumer left with unacknowledged deliveries (its previous aggregator
died mid-batch) is re-created at its ack floor, so the events come again in
stream order instead of new ones overtaking the redeliveries, which would
look like gaps for a while. A missing durable is created after the stream
sequence the store last committed; an empty store with a used durable
starts over. `StartFrom.BEGINNING` / `StartFrom.TIME` re-create it at the
start of the stream / at the first message stored at or after a time (the
stream's time, not the events'). Run one aggregator per durable name.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

import nats.errors
from loguru import logger
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError

from events.subjects import event_subject_node, parse_msg_id
from volfsm.analytics.defaults import DEFAULT_DURABLE, EVENT_SUBJECTS
from volfsm.analytics.fetch import fetch
from volfsm.analytics.ingest import UNREADABLE, BatchBuilder, Ingestor, IngestStore
from volfsm.analytics.partition import check_partitioned
from volfsm.bus.stream import MSG_ID_HEADER


class StartFrom(StrEnum):
    """Where the consumer starts."""

    RESUME = "resume"
    """Where the durable consumer left off (from the beginning if it does not exist)."""
    BEGINNING = "beginning"
    TIME = "time"


@dataclass(slots=True)
class AggregatorConfig:
    """How the aggregator consumes."""

    durable: str = DEFAULT_DURABLE
    stream: str | None = None
    """The JetStream stream; None: the stream holding `subjects`."""
    subjects: str = EVENT_SUBJECTS
    batch: int = 1000
    fetch_timeout_s: float = 1.0
    ack_wait_s: float = 30.0
    start: StartFrom = StartFrom.RESUME
    start_time_us: int | None = None
    """With `StartFrom.TIME`: the first message stored at or after this UTC µs."""
    partition: int | None = None
    """The ingest partition this aggregator owns (None: the whole stream); `subjects` and
    `durable` must be the partition's (`partition_subjects`, `partition_durable`)."""
    partitions: int = 1
    commit_events: int = 5000
    """Fetches are applied as they come and committed together once this many events wait
    (or a fetch comes back short: the consumer has caught up)."""
    commit_interval_s: float = 1.0
    """... or the oldest uncommitted fetch is this old."""


def _now_us() -> int:
    return time.time_ns() // 1000


def _start_time(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, tz=UTC)


def _max_ack_pending(cfg: AggregatorConfig) -> int:
    """Deliveries a consumer may leave unacknowledged: a group committing and one filling."""
    return max(1000, 2 * (cfg.commit_events + cfg.batch) + cfg.batch)


def _group_size(cfg: AggregatorConfig, max_ack_pending: int | None) -> int:
    """Events to group into one commit under a consumer's unacknowledged limit."""
    if max_ack_pending is None or max_ack_pending < 0:
        return cfg.commit_events
    return max(1, min(cfg.commit_events, (max_ack_pending - cfg.batch) // 2 - cfg.batch))


def _msg_id(msg: Msg) -> tuple[str, int] | None:
    """(node, seq) from the msg id, if it names the node whose subject the message came on."""
    try:
        key = parse_msg_id((msg.headers or {}).get(MSG_ID_HEADER, ""))
    except ValueError:
        return None
    return key if key[0] == event_subject_node(msg.subject) else None


class Aggregator:
    """Consumes events from JetStream into an `AnalyticsStore`, each (node, seq) once."""

    def __init__(
        self,
        store: IngestStore,
        js: JetStreamContext,
        config: AggregatorConfig | None = None,
        *,
        clock: Callable[[], int] = _now_us,
    ) -> None:
        self.store = store
        self.js = js
        self.config = config or AggregatorConfig()
        self.clock = clock
        self.ingestor = Ingestor(store, clock)
        self.stats = self.ingestor.stats
        self.stream = ""
        self._start = self.config.start
        self._sub: JetStreamContext.PullSubscription | None = None
        self._pending: tuple[asyncio.Future[None], Msg] | None = None
        """The batch being committed (in a worker thread) and its last message, to ack after."""
        self._group: _Group | None = None
        """Fetches applied and not committed yet."""
        self._commit_events = self.config.commit_events

    # ------------------------------------------------------------- consumer

    async def prepare(self) -> None:
        """Find the stream, create / re-create / bind the durable consumer.

        The configured start applies to the first call only; later calls resume.
        """
        cfg = self.config
        self.stream = cfg.stream or await self.js.find_stream_name_by_subject(cfg.subjects)
        if cfg.partition is not None:
            await check_partitioned(self.js, self.stream, cfg.partitions)
        info = await self._consumer_info()
        if self._start is StartFrom.BEGINNING:
            await self._create(info, DeliverPolicy.ALL)
        elif self._start is StartFrom.TIME:
            if cfg.start_time_us is None:
                raise ValueError("StartFrom.TIME needs start_time_us")
            await self._create(info, DeliverPolicy.BY_START_TIME, start_us=cfg.start_time_us)
        elif info is None:
            await self._create_missing()
        else:
            await self._resume(info)
        self._sub = await self.js.pull_subscribe_bind(durable=cfg.durable, stream=self.stream)
        bound = await self._consumer_info()
        allowed = bound.config.max_ack_pending if bound is not None else None
        self._commit_events = _group_size(cfg, allowed)
        self._start = StartFrom.RESUME  # set up again after an error: resume, never rewind
        logger.info("consuming {} ({}) as {}", self.stream, cfg.subjects, cfg.durable)

    async def _create_missing(self) -> None:
        """No durable: start after what the store committed from this stream, else at its start."""
        position = self.store.position()
        if position is not None and position[0] == self.stream:
            await self._create(None, DeliverPolicy.BY_START_SEQUENCE, start_seq=position[1] + 1)
        else:
            await self._create(None, DeliverPolicy.ALL)

    async def _resume(self, info: ConsumerInfo) -> None:
        """Keep the durable, unless the store is new or deliveries are left unacknowledged."""
        durable = self.config.durable
        delivered = info.delivered.stream_seq if info.delivered is not None else 0
        if not self.ingestor.ranges.ranges and delivered:
            logger.info("store {} is empty: consumer {} starts over", self.store.path, durable)
            await self._create(info, DeliverPolicy.ALL)
        elif info.num_ack_pending:
            floor = (info.ack_floor.stream_seq if info.ack_floor is not None else 0) or 0
            logger.info(
                "consumer {} has {} unacknowledged deliveries; re-creating it after stream seq {}",
                durable,
                info.num_ack_pending,
                floor,
            )
            await self._create(info, DeliverPolicy.BY_START_SEQUENCE, start_seq=floor + 1)

    async def _consumer_info(self) -> ConsumerInfo | None:
        try:
            info: ConsumerInfo = await self.js.consumer_info(self.stream, self.config.durable)
        except NotFoundError:
            return None
        return info

    async def _create(
        self,
        existing: ConsumerInfo | None,
        policy: DeliverPolicy,
        *,
        start_seq: int | None = None,
        start_us: int | None = None,
    ) -> None:
        cfg = self.config
        if existing is not None:
            await self.js.delete_consumer(self.stream, cfg.durable)
        config = ConsumerConfig(
            durable_name=cfg.durable,
            deliver_policy=policy,
            opt_start_seq=start_seq,
            opt_start_time=_start_time(start_us) if start_us is not None else None,
            ack_policy=AckPolicy.ALL,
            ack_wait=cfg.ack_wait_s,
            max_deliver=-1,
            max_ack_pending=_max_ack_pending(cfg),
            filter_subject=cfg.subjects,
        )
        await self.js.add_consumer(self.stream, config)

    # -------------------------------------------------------------- running

    async def run(self, stop: asyncio.Event | None = None, retry_s: float = 1.0) -> None:
        """Consume until `stop` is set (or forever).

        A NATS error (an outage, a leader change, a lost ack, a consumer or
        stream that went away) is logged; after `retry_s` the consumer is set
        up again as at start, so deliveries left unacknowledged come again in
        order. Anything else (the store failing) ends the run.
        """
        while stop is None or not stop.is_set():
            try:
                if self._sub is None:
                    await self.prepare()
                await self.poll()
            except nats.errors.Error as exc:
                logger.warning("analytics consumer: {}; retrying", exc or type(exc).__name__)
                await self._commit_open(ack=False)  # they come again: the ranges know them
                await self._drop_subscription()
                await asyncio.sleep(retry_s)
        with contextlib.suppress(nats.errors.Error):
            await self.flush()

    async def _drop_subscription(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def run_until_idle(self, idle_polls: int = 1) -> int:
        """Consume until `idle_polls` fetches in a row return nothing; messages handled."""
        if self._sub is None:
            await self.prepare()
        total = idle = 0
        while idle < idle_polls:
            got = await self.poll()
            total += got
            idle = 0 if got else idle + 1
        return total

    async def poll(self) -> int:
        """Fetch and apply one batch; commit what waits when due. How many messages came.

        Fetches are grouped into one commit (`commit_events`,
        `commit_interval_s`; a short fetch commits at once). Commits are
        pipelined: one runs in a worker thread while the next fetches are
        applied; it starts once the one before is committed, and a commit's
        messages are acknowledged only after it (here, for the commit
        before, or by `flush`). An empty fetch flushes.

        If a commit fails the in-memory state is ahead of the store: drop
        this aggregator and build a new one (it reloads the committed state).
        A cancelled poll still waits for a commit already under way.
        """
        msgs = await self._fetch()
        if not msgs:
            await self.flush()
            return 0
        self._add(msgs)
        group = self._group
        assert group is not None
        cfg = self.config
        if (
            len(msgs) < cfg.batch
            or group.events >= self._commit_events
            or time.monotonic() - group.since >= cfg.commit_interval_s
        ):
            await self._commit_open(ack=True)
        return len(msgs)

    async def flush(self) -> None:
        """Commit what was applied, wait for the commit, then acknowledge it."""
        await self._commit_open(ack=True)
        last = await self._committed()
        if last is not None:
            await self._ack(last)

    async def _commit_open(self, *, ack: bool) -> None:
        """Start committing the applied fetches (after the commit before is done).

        With `ack`, acknowledge the commit before; else wait for both, acking nothing.
        """
        group, self._group = self._group, None
        if group is None:
            return
        for node, msg in group.last_of_node.items():
            group.builder.stored_at(node, int(msg.metadata.timestamp.timestamp() * 1_000_000))
        batch = group.builder.finish((self.stream, group.last.metadata.sequence.stream))
        done = await self._committed()
        commit = asyncio.ensure_future(asyncio.to_thread(self.store.commit, batch))
        self._pending = (commit, group.last)
        if not ack:
            await self._committed()
        elif done is not None:
            try:
                await self._ack(done)
            except asyncio.CancelledError:
                await self._committed()
                raise

    async def _committed(self) -> Msg | None:
        """Wait for the commit under way (if any); the last message of its batch."""
        if self._pending is None:
            return None
        commit, last = self._pending
        try:
            await asyncio.shield(commit)
        except asyncio.CancelledError:
            await asyncio.wait([commit])
            raise
        finally:
            if commit.done():
                self._pending = None
                if not commit.cancelled() and commit.exception() is None:
                    self.stats.batches += 1
                    self.stats.last_commit_us = self.clock()
        commit.result()
        return last

    async def _fetch(self) -> list[Msg]:
        assert self._sub is not None, "call prepare() first"
        try:
            return await fetch(self._sub, self.config.batch, self.config.fetch_timeout_s)
        except (TimeoutError, NatsTimeoutError):
            return []

    async def _ack(self, last: Msg) -> None:
        """Acknowledge a committed batch: with AckPolicy.ALL its last message covers it."""
        await last.ack_sync(timeout=5)

    def _add(self, msgs: list[Msg]) -> None:
        """Flatten, dedupe and fold fetched messages into the open group."""
        group = self._group
        if group is None:
            group = self._group = _Group(self.ingestor.batch(), msgs[-1], time.monotonic())
        builder = group.builder
        add = builder.add
        last_of_node = group.last_of_node
        for msg in msgs:
            try:
                row = add(msg.data, event_subject_node(msg.subject))
            except UNREADABLE as exc:
                builder.reject(
                    msg.data,
                    exc,
                    key=_msg_id(msg),
                    subject=msg.subject,
                    stream_seq=msg.metadata.sequence.stream,
                )
                continue
            if row is not None:
                last_of_node[row.node] = msg
        group.last = msgs[-1]
        group.events += len(msgs)


@dataclass(slots=True)
class _Group:
    """Fetches applied into one batch builder, not committed yet."""

    builder: BatchBuilder
    last: Msg
    since: float
    events: int = 0
    last_of_node: dict[str, Msg] = field(default_factory=dict)
