"""Put a node's lost log back from JetStream (`volfsm serve --restore-from-stream`).

The relay refuses to start when the stream holds more of this node's
events than its log (`StreamAheadError`): the log was lost or restored from
an older backup, or another node uses this name. Told that it is the
former, the service copies the missing events back, each with its own seq,
stream version and time (`EventLog.restore`), before anything else reads
the log. Reconstruction then checks that history against the node as after
any restart: a mount the restored history believes in but the node lacks
becomes Uncertain with its reason, like any other.

Refused, with the reason, when it cannot be this node's history: the
stream's copy of the log's last event differs from the log's or is gone
(nothing to check against), or the stream no longer holds the events right
after the log's end (retention dropped them; then only purging the node's
subjects is left).

It reads the stream with the `node` role's rights only (`volfsm.bus.roles`):
a direct get of the node's last event and one consumer filtered on the
node's own subjects.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from nats.js import JetStreamContext

from events.log import EventLog
from events.types import Envelope
from volfsm.bus.history import node_history
from volfsm.bus.stream import last_node_seq, setup_event_stream
from volfsm.errors import VolfsmError

RESTORE_CHUNK = 10_000
"""Events per restore transaction: a large history goes in as several, each durable."""


class LogRestoreError(VolfsmError):
    """The stream's events of this node cannot be put back into this log."""


@dataclass(frozen=True)
class RestoreResult:
    """What `restore_from_stream` did."""

    log_last_seq: int
    """Where the log ended before."""
    stream_last_seq: int
    """The newest event of this node in the stream."""
    restored: int
    """Events put back (seq log_last_seq + 1 .. stream_last_seq)."""


def _same(ours: Envelope, theirs: Envelope) -> bool:
    return (ours.stream, ours.version, ours.type, ours.ts, ours.node, ours.body) == (
        theirs.stream,
        theirs.version,
        theirs.type,
        theirs.ts,
        theirs.node,
        theirs.body,
    )


async def restore_from_stream(
    log: EventLog, js: JetStreamContext, stream: str, node: str
) -> RestoreResult:
    """Copy this node's events the log lacks from `stream` into `log` (see the module)."""
    local_last = await asyncio.to_thread(log.last_seq)
    in_stream = await last_node_seq(js, stream, node)
    if in_stream <= local_last:
        return RestoreResult(local_last, in_stream, 0)
    ours = list(log.read_after(local_last - 1, local_last)) if local_last else []
    pending: list[Envelope] = []
    restored = 0
    next_seq = local_last + 1
    checked = local_last == 0
    async for batch in node_history(js, stream, node):
        for env in batch:
            if env.seq < local_last or (checked and env.seq < next_seq):
                continue  # before the log's end, or a copy the stream holds twice
            if env.seq == local_last:
                if not ours or not _same(ours[0], env):
                    raise LogRestoreError(
                        f"stream {stream} holds a different event seq {env.seq} of node {node}"
                        " than the log: this log is not that node's history (another node"
                        " using the same name?); nothing restored"
                    )
                checked = True
                continue
            if not checked:
                raise LogRestoreError(
                    f"stream {stream} no longer holds event seq {local_last} of node {node}"
                    " (retention dropped it), so there is no way to check that this log is"
                    " that node's history; nothing restored"
                )
            if env.seq > next_seq:
                restored += await asyncio.to_thread(log.restore, pending)
                done = (
                    f"seq {local_last + 1}..{next_seq - 1} restored"
                    if restored
                    else "nothing restored"
                )
                raise LogRestoreError(
                    f"stream {stream} no longer holds events {next_seq}..{env.seq - 1} of node"
                    f" {node} (retention dropped them; {done}): the rest of the history cannot"
                    " be restored; purge the node's subjects from the stream to start a new"
                    " history"
                )
            pending.append(env)
            next_seq += 1
        if len(pending) >= RESTORE_CHUNK:
            restored += await asyncio.to_thread(log.restore, pending)
            pending = []
    if pending:
        restored += await asyncio.to_thread(log.restore, pending)
    return RestoreResult(local_last, in_stream, restored)


async def prepare_and_restore(
    log: EventLog,
    js: JetStreamContext,
    stream: str,
    node: str,
    *,
    manage: bool,
    replicas: int,
    duplicate_window_s: float,
) -> RestoreResult:
    """Set the stream up as the relay will (create/update it, or only check it), then restore."""
    await setup_event_stream(
        js,
        stream,
        node=node,
        manage=manage,
        replicas=replicas,
        duplicate_window_s=duplicate_window_s,
    )
    return await restore_from_stream(log, js, stream, node)
