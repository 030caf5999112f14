"""The outbox relay: the local event log, published to a JetStream stream in order, once.

The log is the outbox. The relay reads it after a named cursor
(`relay:<stream>`), publishes each event on `volfsm.<node>.events.<Type>`
with `Nats-Msg-Id: <node>:<seq>/<key>` (`events.subjects.msg_key`: secret
to this log) and the JSON envelope as body, and moves the cursor only over
events JetStream acknowledged. Appends never wait for the relay: it only
reads the log, and `notify()` merely wakes it early.

How it stays exactly-once and in order, whatever NATS does:

* One connection is one *session*. nats-py's own reconnect is off: after a
  reconnect it replays its buffered publishes, which can land behind a
  message that was lost in the dead socket and so break the order. Any
  failure (disconnect, closed connection, an error reply, or a PubAck that
  does not arrive within `publish_timeout_s`: outcome unknown) ends the
  session; the relay closes the connection and opens a new one itself, with
  backoff, for as long as it runs.
* Every session starts by reconciling with the stream: the last message on
  `volfsm.<node>.events.>` names, in its msg id, the last event of this node
  the stream holds. Publishing resumes right after it. So an event acked
  but not yet recorded in the cursor (a crash, a timeout) is never sent
  again, even long after the duplicate window has passed; the msg id only
  covers the short race where an old connection's messages are still being
  stored.
* Within a session publishes are pipelined (at most `max_inflight`), each
  with its own deadline; a single connection delivers them to the stream in
  order, so the stream holds a gap-free prefix of the log.
* If the stream holds *less* than the cursor says (an R1 server lost acked
  messages it had not synced, or the stream was recreated) and the stream
  has no limits that could have removed them, the relay rewinds and
  republishes the missing tail: the log is the source of truth.

What it needs from NATS is the `node` role (`volfsm.bus.roles`): publish on
its own subjects, stream info, and a direct get of the last message on its
own subjects. Its replies come on its node's inbox prefix. With
`manage_stream` it also creates the stream or updates its settings (the
embedded server, or a credential allowed to); without, it only checks the
stream. A request the server denies during set-up (a permissions
violation) fails the session at once with what to change, instead of
waiting for a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from loguru import logger
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from events.codec import envelope_to_json
from events.errors import LogClosedError
from events.log import EventLog, row_to_envelope
from events.subjects import check_token, events_subject, msg_id, msg_key, node_events_filter
from volfsm import faultpoints
from volfsm.bus.connect import OWNED_OPTIONS, Denials, connect_once
from volfsm.bus.errors import NatsAuthError, NatsDeniedError, NatsSetupError, StreamConfigError
from volfsm.bus.roles import node_inbox_prefix
from volfsm.bus.stream import (
    MSG_ID_HEADER,
    STREAM_CREATE_HINT,
    last_node_seq,
    may_drop_messages,
    setup_event_stream,
)

__all__ = [
    "NatsAuthError",
    "NatsSetupError",
    "Relay",
    "RelayConfig",
    "RelayCounters",
    "StreamAheadError",
    "StreamConfigError",
]


class StreamAheadError(NatsSetupError):
    """The stream holds events of this node beyond the end of the local log."""


@dataclass
class RelayCounters:
    """What the relay did since it was created (for metrics)."""

    published: int = 0
    """Publishes sent, re-sends included."""
    acked: int = 0
    """PubAcks received (duplicates included)."""
    duplicates: int = 0
    """PubAcks that said the stream already had the message (msg-id dedupe)."""
    timeouts: int = 0
    """In-flight publishes without a PubAck within `publish_timeout_s`."""
    errors: int = 0
    """Error replies from JetStream (API errors, no stream answering)."""
    connects: int = 0
    """Sessions opened (connected, stream checked, reconciled)."""
    reconnects: int = 0
    """Sessions opened after the first."""
    skipped: int = 0
    """Events found already in the stream when reconciling, so not sent again."""
    rewinds: int = 0
    """Times the stream held less than the cursor and the tail was republished."""
    max_inflight_seen: int = 0
    """Highest number of publishes awaiting a PubAck at once."""


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAckReply(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: _ApiError | None = None


_decode_reply = msgspec.json.Decoder(_PubAckReply).decode


class _SessionEnded(Exception):
    """The current connection is no longer trusted; reconnect and reconcile."""


@dataclass(frozen=True, kw_only=True)
class RelayConfig:
    """How a relay publishes: the stream, its window and timings, and the NATS connect options."""

    stream: str = "VOLFSM"
    replicas: int = 1
    duplicate_window_s: float = 120.0
    manage_stream: bool = True
    """Create the stream if missing and update its settings (needs stream-management rights);
    False: only check it and change nothing (the `node` role)."""
    max_inflight: int = 256
    """Publishes awaiting a PubAck at once."""
    publish_timeout_s: float = 5.0
    poll_interval_s: float = 0.2
    """How often the log is looked at when no append wakes the relay."""
    connect_timeout_s: float = 2.0
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    """Reconnect backoff bounds."""
    cursor_name: str | None = None
    """The log cursor of acknowledged events (default ``relay:<stream>``)."""
    connect_options: dict[str, Any] = field(default_factory=dict)
    """Passed to nats-py's connect (credentials, TLS, name); not the reconnect options.

    `inbox_prefix` defaults to the node's (`_INBOX.node.<node>`)."""


class Relay:
    """Publishes one node's event log to a JetStream stream; see the module docstring.

    `connect_options` go to `nats.connect` unchanged (user/password, token,
    user_credentials, nkeys_seed, tls, tls_hostname, name, inbox_prefix ...);
    the relay owns reconnects and the connection callbacks.
    """

    def __init__(
        self,
        log: EventLog,
        nats_url: str,
        node: str,
        config: RelayConfig | None = None,
    ) -> None:
        cfg = config if config is not None else RelayConfig()
        owned = OWNED_OPTIONS & cfg.connect_options.keys()
        if owned:
            raise ValueError(
                f"the relay manages {sorted(owned)} itself (it reconnects and reconciles "
                "on its own); do not pass them"
            )
        if cfg.max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        if cfg.publish_timeout_s <= 0:
            raise ValueError("publish_timeout_s must be positive")
        self.config = cfg
        self.log = log
        self.nats_url = nats_url
        self.node = check_token(node, "node")
        self.stream = check_token(cfg.stream, "stream name")
        self.replicas = cfg.replicas
        self.duplicate_window_s = cfg.duplicate_window_s
        self.max_inflight = cfg.max_inflight
        self.publish_timeout_s = cfg.publish_timeout_s
        self.poll_interval_s = cfg.poll_interval_s
        self.connect_timeout_s = cfg.connect_timeout_s
        self.backoff_initial_s = cfg.backoff_initial_s
        self.backoff_max_s = cfg.backoff_max_s
        self.cursor_name = cfg.cursor_name or f"relay:{cfg.stream}"
        self.manage_stream = cfg.manage_stream
        self.connect_options = {"inbox_prefix": node_inbox_prefix(node), **cfg.connect_options}
        self.counters = RelayCounters()
        self.last_error: str | None = None
        """The most recent reason publishing stopped or could not start (None once healthy)."""

        self._log = logger.bind(node=node, component="relay", nats_stream=cfg.stream)
        self._subjects: dict[str, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._run_task: asyncio.Task[None] | None = None
        self._cursor_task: asyncio.Task[None] | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._nc: NATS | None = None
        self._epoch = 0
        self._failure: str | None = None
        self._session_error: str | None = None
        self._denials = Denials()
        self._ready = False
        self._stopping = False
        self._cursor_stop = False
        self._kick = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._acked_changed = asyncio.Event()
        self._cursor_waiters: list[asyncio.Future[None]] = []
        self._inflight: dict[int, float] = {}
        self._window_waiting = False
        self._refill = max(1, cfg.max_inflight // 8)
        self._acked_through = 0
        self._cursor = 0
        self._last_sent = 0
        self._stream_may_drop = False

    # ------------------------------------------------------------------ state

    @property
    def connected(self) -> bool:
        """True while a session is up: connected, stream checked, reconciled."""
        nc = self._nc
        return nc is not None and nc.is_connected

    @property
    def acked_seq(self) -> int:
        """Every event up to this `seq` is in the stream (acked or found when reconciling)."""
        return self._acked_through

    @property
    def cursor(self) -> int:
        """The cursor as last written to the log."""
        return self._cursor

    @property
    def inflight(self) -> int:
        """Publishes sent and not yet acknowledged."""
        return len(self._inflight)

    def lag(self) -> int:
        """Events in the log not yet acknowledged by JetStream."""
        return max(0, self.log.last_seq() - self._acked_through)

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start publishing from the cursor.

        Tries one session right away: wrong credentials, an unusable stream
        or a stream ahead of the log raise (`NatsAuthError`,
        `StreamConfigError`, `StreamAheadError`). NATS being unreachable does
        not: the relay keeps trying in the background and the log keeps
        accepting appends (that is lag, not failure).
        """
        if self._run_task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stopping = False
        self._stop_event.clear()
        self._cursor_stop = False
        cursor = await asyncio.to_thread(self.log.get_cursor, self.cursor_name)
        self._cursor = self._acked_through = self._last_sent = cursor
        self._cursor_task = asyncio.create_task(self._write_cursors(), name="relay-cursor")
        first: NATS | None = None
        try:
            first = await self._open()
        except NatsSetupError:
            await self._stop_cursor_writer()
            raise
        except Exception as exc:
            self._note_error(exc, first=True)
        self._run_task = asyncio.create_task(self._run(first), name=f"relay:{self.stream}")

    async def stop(self, flush_timeout: float = 5.0) -> None:
        """Publish what can be published within `flush_timeout`, then close. Idempotent."""
        if self._run_task is None:
            return
        if flush_timeout > 0 and not self._run_task.done():
            await self.flush(flush_timeout)
        self._stopping = True
        self._stop_event.set()
        self._kick.set()
        run = self._run_task
        # Let the session end by itself (it closes its connection); cancel only if stuck.
        await asyncio.wait({run}, timeout=2 * self.connect_timeout_s + 3.0)
        if not run.done():
            run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        self._run_task = None
        await self._stop_cursor_writer()
        self._log.info(
            "relay stopped at seq {} (log at {}, cursor {})",
            self._acked_through,
            self.log.last_seq(),
            self._cursor,
        )

    async def flush(self, timeout: float) -> bool:
        """Wait until the stream holds the log as it is now and the cursor says so.

        Both positions count: after a rewind (the stream lost events) the
        cursor read at start is ahead of what the stream holds until the
        tail is republished. False if `timeout` ran out.
        """
        loop = asyncio.get_running_loop()
        target = await asyncio.to_thread(self.log.last_seq)
        deadline = loop.time() + timeout
        self.notify()
        while min(self._cursor, self._acked_through) < target:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._cursor_waiters.append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, remaining)
        return True

    def notify(self) -> None:
        """New events were appended: look now instead of at the next poll. Thread-safe."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if threading.get_ident() == self._loop_thread:
            self._kick.set()
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._kick.set)

    # ---------------------------------------------------------------- session

    async def _run(self, first: NATS | None) -> None:
        backoff = self.backoff_initial_s
        nc = first
        while not self._stopping:
            if nc is None:
                try:
                    nc = await self._open()
                except Exception as exc:
                    self._note_error(exc)
                    await self._pause(backoff)
                    backoff = min(backoff * 2, self.backoff_max_s)
                    continue
            acked_before = self.counters.acked
            try:
                await self._session(nc)
            except Exception as exc:
                self._note_error(exc)
            finally:
                await self._end_session(nc)
                nc = None
            if self._stopping:
                return
            if self.counters.acked > acked_before:
                backoff = self.backoff_initial_s
            await self._pause(backoff)
            backoff = min(backoff * 2, self.backoff_max_s)

    async def _pause(self, seconds: float) -> None:
        """Back off before reconnecting; only `stop()` cuts it short (appends do not)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), seconds)

    async def _open(self) -> NATS:
        """Connect, check the stream, reconcile the cursor with it: one new session."""
        self._epoch += 1
        self._failure = None
        self._session_error = None
        self._denials.clear()
        nc = await self._connect(self._epoch)
        try:
            js = nc.jetstream(timeout=max(self.publish_timeout_s, 1.0))
            await self._unless_denied(self._prepare(js))
        except BaseException:
            self._epoch += 1  # the close below is ours, not a failure to report
            await self._close(nc)
            raise
        self._nc = nc
        self.counters.connects += 1
        if self.counters.connects > 1:
            self.counters.reconnects += 1
        self.last_error = None
        self._log.info(
            "relay connected to {}: stream {} holds this node's events up to seq {}",
            self.nats_url,
            self.stream,
            self._acked_through,
        )
        return nc

    async def _prepare(self, js: JetStreamContext) -> None:
        await self._ensure_stream(js)
        await self._reconcile(js)

    async def _unless_denied(self, setup: Awaitable[None]) -> None:
        """Run `setup`; StreamConfigError as soon as the server denies one of its requests."""
        try:
            await self._denials.guard(setup)
        except NatsDeniedError as exc:
            raise StreamConfigError(self._denial_text(exc.text.lower())) from None

    def _denial_text(self, text: str) -> str:
        fix = STREAM_CREATE_HINT.format(stream=self.stream)
        if self.manage_stream and ("stream.create" in text or "stream.update" in text):
            return (
                f"NATS denied creating or updating stream {self.stream} ({text}): this "
                f"credential may not manage streams. Create the stream with `{fix}` and the admin "
                "credential, and start this node with --stream-setup check"
            )
        return (
            f"NATS denied a request the relay needs ({text}): the credential lacks a permission "
            f"of the node role for node {self.node} and stream {self.stream} (see "
            "deploy/nats/roles/)"
        )

    async def _connect(self, epoch: int) -> NATS:
        async def on_error(exc: Exception) -> None:
            if epoch != self._epoch:
                return
            if not self._ready:
                self._denials.note(exc)
                return
            self._session_error = str(exc) or type(exc).__name__
            if "permissions violation" in self._session_error.lower():
                # A denied publish gets no PubAck: say why now instead of timing out.
                self._fail(epoch, f"NATS denied a request: {self._session_error}")
            else:
                self.last_error = f"NATS error: {self._session_error}"
                self._log.warning("NATS error: {}", exc)

        async def on_disconnected() -> None:
            self._fail(epoch, "disconnected from NATS")

        async def on_closed() -> None:
            self._fail(epoch, "NATS connection closed")

        return await connect_once(
            self.nats_url,
            connect_timeout_s=self.connect_timeout_s,
            error_cb=on_error,
            disconnected_cb=on_disconnected,
            closed_cb=on_closed,
            **self.connect_options,
        )

    async def _ensure_stream(self, js: JetStreamContext) -> None:
        setup = await setup_event_stream(
            js,
            self.stream,
            node=self.node,
            manage=self.manage_stream,
            replicas=self.replicas,
            duplicate_window_s=self.duplicate_window_s,
        )
        if setup.created:
            self._log.info("created JetStream stream {}", self.stream)
        elif setup.changed:
            self._log.warning("updated JetStream stream {}: {}", self.stream, setup.changed)
        self._stream_may_drop = may_drop_messages(setup.config)

    async def _reconcile(self, js: JetStreamContext) -> None:
        """Align our position with the last event of this node the stream holds."""
        in_stream = await last_node_seq(js, self.stream, self.node)
        local_last = await asyncio.to_thread(self.log.last_seq)
        if in_stream > local_last:
            raise StreamAheadError(
                f"stream {self.stream} holds events of node {self.node} up to seq {in_stream} but "
                f"the local log ends at {local_last}: is this the right log, or another node "
                "using the same name? If this node's log was lost or is an older backup, start "
                "once with --restore-from-stream to put its events back from the stream"
            )
        if in_stream > self._acked_through:
            self.counters.skipped += in_stream - self._acked_through
            self._log.info(
                "stream already holds seq {}..{} (acked before the cursor was written); "
                "not sending them again",
                self._acked_through + 1,
                in_stream,
            )
            self._set_acked(in_stream)
        elif in_stream < self._acked_through:
            if self._stream_may_drop:
                self._log.info(
                    "stream ends at seq {} below cursor {}; its limits may have removed events, "
                    "so not republishing",
                    in_stream,
                    self._acked_through,
                )
            else:
                self.counters.rewinds += 1
                self._log.warning(
                    "stream lost events: it ends at seq {} but {} were acked; republishing",
                    in_stream,
                    self._acked_through,
                )
                self._set_acked(in_stream)
        self._last_sent = self._acked_through

    async def _session(self, nc: NATS) -> None:
        """Publish until the connection fails or the relay stops."""
        epoch = self._epoch
        inbox = nc.new_inbox() + "."
        await nc.subscribe(inbox + "*", cb=self._reply_handler(epoch, len(inbox)))
        self._ready = True
        pump = asyncio.create_task(self._pump(nc, inbox), name="relay-pump")
        self._pump_task = pump
        watchdog = asyncio.create_task(self._watch_deadlines(epoch), name="relay-deadlines")
        try:
            await asyncio.wait({pump})
        finally:
            self._pump_task = None
            watchdog.cancel()
            pump.cancel()
            await asyncio.gather(watchdog, pump, return_exceptions=True)
        if pump.cancelled():
            if self._stopping:
                return
            raise _SessionEnded(self._failure or "session cancelled")
        exc = pump.exception()
        if exc is not None:
            raise exc

    async def _pump(self, nc: NATS, inbox: str) -> None:
        loop = asyncio.get_running_loop()
        inflight = self._inflight
        node = self.node
        key = msg_key(self.log.log_id)
        timeout = self.publish_timeout_s
        subjects = self._subjects
        counters = self.counters
        while True:
            self._kick.clear()
            if self._failure is not None:
                raise _SessionEnded(self._failure)
            if self._stopping:
                return
            free = self.max_inflight - len(inflight)
            if free <= 0:
                self._window_waiting = True
                await self._kick.wait()
                continue
            after = self._last_sent
            rows = list(self.log.rows_after(after, until_seq=after + free))
            if not rows:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), self.poll_interval_s)
                continue
            for row in rows:
                seq = row[0]
                subject = subjects.get(row[3])
                if subject is None:
                    subject = subjects[row[3]] = events_subject(node, row[3])
                data = envelope_to_json(row_to_envelope(row))
                faultpoints.hit("relay.before_publish", row[3])
                inflight[seq] = loop.time() + timeout
                self._last_sent = seq
                await nc.publish(
                    subject,
                    data,
                    reply=inbox + str(seq),
                    headers={MSG_ID_HEADER: msg_id(node, seq, key)},
                )
                counters.published += 1
            if len(inflight) > counters.max_inflight_seen:
                counters.max_inflight_seen = len(inflight)

    def _reply_handler(self, epoch: int, prefix_len: int) -> Callable[[Msg], Any]:
        async def on_reply(msg: Msg) -> None:
            if epoch != self._epoch:
                return
            try:
                seq = int(msg.subject[prefix_len:])
            except ValueError:
                return
            if seq not in self._inflight:
                return
            self._on_pub_ack(epoch, seq, msg)

        return on_reply

    def _on_pub_ack(self, epoch: int, seq: int, msg: Msg) -> None:
        data = msg.data
        if not data:
            status = (msg.headers or {}).get("Status", "?")
            self.counters.errors += 1
            self._fail(
                epoch,
                f"publish of seq {seq} got status {status}: no stream takes "
                f"{node_events_filter(self.node)}",
            )
            return
        try:
            reply = _decode_reply(data)
        except msgspec.DecodeError:
            self.counters.errors += 1
            self._fail(epoch, f"undecodable PubAck for seq {seq}: {data[:200]!r}")
            return
        if reply.error is not None:
            self.counters.errors += 1
            err = reply.error
            self._fail(
                epoch,
                f"JetStream refused seq {seq}: {err.description} "
                f"(code {err.code}, err_code {err.err_code})",
            )
            return
        if reply.stream != self.stream:
            self.counters.errors += 1
            self._fail(epoch, f"seq {seq} was stored in stream {reply.stream!r}, not {self.stream}")
            return
        inflight = self._inflight
        del inflight[seq]
        self.counters.acked += 1
        if reply.duplicate:
            self.counters.duplicates += 1
        self._set_acked(next(iter(inflight)) - 1 if inflight else self._last_sent)
        if self._window_waiting and self.max_inflight - len(inflight) >= self._refill:
            self._window_waiting = False
            self._kick.set()

    def _set_acked(self, seq: int) -> None:
        if seq != self._acked_through:
            self._acked_through = seq
            self._acked_changed.set()

    async def _watch_deadlines(self, epoch: int) -> None:
        """End the session when the oldest in-flight publish is past its deadline."""
        loop = asyncio.get_running_loop()
        tick = min(0.1, self.publish_timeout_s / 4)
        inflight = self._inflight
        while True:
            await asyncio.sleep(tick)
            if not inflight:
                continue
            now = loop.time()
            seq, deadline = next(iter(inflight.items()))
            if now < deadline:
                continue
            self.counters.timeouts += sum(1 for d in inflight.values() if d <= now)
            cause = f"; last NATS error: {self._session_error}" if self._session_error else ""
            self._fail(
                epoch,
                f"no PubAck for seq {seq} within {self.publish_timeout_s}s (outcome unknown"
                f"{cause}); reconnecting to check the stream",
            )
            return

    def _fail(self, epoch: int, reason: str) -> None:
        """End session `epoch` (if still current) for `reason`."""
        if epoch != self._epoch or self._failure is not None or self._stopping:
            return
        self._failure = reason
        self.last_error = reason
        self._log.warning("relay session ends: {}", reason)
        self._kick.set()
        pump = self._pump_task
        if pump is not None and not pump.done():
            pump.cancel()

    async def _end_session(self, nc: NATS) -> None:
        self._ready = False
        self._epoch += 1  # callbacks and replies of the old connection are now ignored
        self._nc = None
        self._inflight.clear()
        self._window_waiting = False
        self._last_sent = self._acked_through
        await self._close(nc)

    @staticmethod
    async def _close(nc: NATS) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 2.0)

    def _note_error(self, exc: BaseException, *, first: bool = False) -> None:
        text = str(exc) or type(exc).__name__
        repeated = text == self.last_error
        self.last_error = text
        if isinstance(exc, _SessionEnded):
            return
        if repeated and not first:
            self._log.debug("relay still cannot publish: {}", text)
        else:
            self._log.warning("relay cannot publish: {}", text)

    # ---------------------------------------------------------------- cursor

    async def _write_cursors(self) -> None:
        """Write the acked position to the log cursor, one write at a time, coalescing."""
        while True:
            await self._acked_changed.wait()
            self._acked_changed.clear()
            target = self._acked_through
            if target != self._cursor:
                faultpoints.hit("relay.before_cursor")
                try:
                    await asyncio.to_thread(self.log.set_cursor, self.cursor_name, target)
                except LogClosedError:
                    self._log.warning("log closed; relay cursor stays at {}", self._cursor)
                    return
                except Exception as exc:
                    self._note_error(exc)
                    await asyncio.sleep(0.5)
                    self._acked_changed.set()
                    continue
                self._cursor = target
            # Wake flush() on every pass: the acked position can leave and come
            # back to the cursor (a rewind) without a write in between.
            waiters, self._cursor_waiters = self._cursor_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            if self._cursor_stop and self._acked_through == self._cursor:
                return

    async def _stop_cursor_writer(self) -> None:
        task = self._cursor_task
        if task is None:
            return
        self._cursor_stop = True
        self._acked_changed.set()
        try:
            await asyncio.wait_for(task, 10.0)
        except TimeoutError:
            self._log.warning("cursor write did not finish; cursor stays at {}", self._cursor)
        self._cursor_task = None
