"""The JetStream event stream: create it, check it, and find a node's last event in it.

Two ways to set the stream up, one per credential: `ensure_event_stream`
creates it or brings its settings to volfsm's (the embedded server, an
admin credential, `volfsm stream create`); `check_event_stream` only reads
its settings and says exactly what is wrong (a `node` role, which may not
change the stream: `volfsm.bus.roles`).

A node finds its last event with a direct get of the last message on its
own subjects (`$JS.API.DIRECT.GET.<stream>.volfsm.<node>.events.>`): the
subject names the node, so NATS can allow it to a node for its own
subjects only. Direct gets need `allow_direct` on the stream; on a
replicated stream any replica that is caught up may answer, so the answer
can trail the leader by the replication delay (milliseconds). The relay
copes: a stale, lower answer only makes it publish again events the stream
already holds, which the duplicate window drops (see `volfsm.bus.relay`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from events.subjects import EVENTS_WILDCARD, node_events_filter, parse_msg_id, subject_covers
from volfsm.bus.errors import StreamConfigError

MSG_ID_HEADER = "Nats-Msg-Id"
STREAM_CREATE_HINT = "volfsm stream create --nats URL --stream {stream}"
"""The command (admin credential) that creates the stream or fixes its settings."""
DIRECT_GET_TRIES = 5
DIRECT_GET_RETRY_S = 0.2


@dataclasses.dataclass(frozen=True)
class StreamSetup:
    """What `ensure_event_stream` found or did."""

    config: StreamConfig
    created: bool = False
    changed: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    """Setting -> (old, new) for every setting that was updated."""


def event_stream_config(name: str, *, replicas: int, duplicate_window_s: float) -> StreamConfig:
    """The stream volfsm creates: every node's events, file storage, limits retention."""
    return StreamConfig(
        name=name,
        subjects=[EVENTS_WILDCARD],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        num_replicas=replicas,
        duplicate_window=duplicate_window_s,
        allow_direct=True,
    )


async def ensure_event_stream(
    js: JetStreamContext, name: str, *, replicas: int, duplicate_window_s: float
) -> StreamSetup:
    """Create stream `name`, or check it and update what can safely change.

    Subjects (ours added), replicas, the duplicate window and direct gets
    are updated; storage, retention, sealed and mirror streams cannot be
    used and raise `StreamConfigError`, as does a server refusing the
    create or update. Needs stream-management rights (not a `node` role's).
    """
    try:
        info = await js.stream_info(name)
    except nats.js.errors.NotFoundError:
        cfg = event_stream_config(name, replicas=replicas, duplicate_window_s=duplicate_window_s)
        try:
            info = await js.add_stream(cfg)
        except nats.js.errors.APIError as exc:
            raise StreamConfigError(
                f"cannot create JetStream stream {name} for {EVENTS_WILDCARD}: "
                f"{exc.description} (err_code {exc.err_code})"
            ) from exc
        return StreamSetup(info.config, created=True)
    cfg = info.config
    problems = unusable_reasons(cfg)
    if problems:
        raise StreamConfigError(
            f"JetStream stream {name} exists but volfsm cannot publish to it: "
            + "; ".join(problems)
        )
    wanted = _wanted_changes(cfg, replicas, duplicate_window_s)
    if not wanted:
        return StreamSetup(cfg)
    changed = {k: (getattr(cfg, k), v) for k, v in wanted.items()}
    try:
        info = await js.update_stream(dataclasses.replace(cfg, **wanted))
    except nats.js.errors.APIError as exc:
        raise StreamConfigError(
            f"JetStream stream {name} exists with other settings "
            f"({', '.join(f'{k}: {o!r} -> {n!r}' for k, (o, n) in changed.items())}) and the "
            f"server refused to update them: {exc.description} (err_code {exc.err_code})"
        ) from exc
    return StreamSetup(info.config, changed=changed)


def _wanted_changes(cfg: StreamConfig, replicas: int, duplicate_window_s: float) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    subjects = list(cfg.subjects or [])
    if not any(subject_covers(s, EVENTS_WILDCARD) for s in subjects):
        changes["subjects"] = [*subjects, EVENTS_WILDCARD]
    if (cfg.num_replicas or 1) != replicas:
        changes["num_replicas"] = replicas
    if abs((cfg.duplicate_window or 0.0) - duplicate_window_s) > 1e-3:
        changes["duplicate_window"] = duplicate_window_s
    if not cfg.allow_direct:
        changes["allow_direct"] = True
    return changes


def stream_problems(
    cfg: StreamConfig,
    *,
    subjects: str = EVENTS_WILDCARD,
    duplicate_window_s: float,
    replicas: int | None = None,
    exact_window: bool = True,
) -> list[str]:
    """What keeps a stream with `cfg` from being volfsm's event stream, one line each.

    `subjects` must be captured; direct gets must be allowed; the duplicate
    window must be `duplicate_window_s` (at least that, unless
    `exact_window`); `replicas`, if given, must match.
    """
    problems = unusable_reasons(cfg)
    if not any(subject_covers(s, subjects) for s in cfg.subjects or []):
        problems.append(f"its subjects {list(cfg.subjects or [])} do not capture {subjects}")
    if not cfg.allow_direct:
        problems.append(
            "direct gets are off (allow_direct: false); a node reads its last event with one"
        )
    window = cfg.duplicate_window or 0.0
    if exact_window and abs(window - duplicate_window_s) > 1e-3:
        problems.append(f"its duplicate window is {window:g}s, not {duplicate_window_s:g}s")
    elif not exact_window and window + 1e-3 < duplicate_window_s:
        problems.append(
            f"its duplicate window is {window:g}s, shorter than this node's "
            f"{duplicate_window_s:g}s (--duplicate-window)"
        )
    if replicas is not None and (cfg.num_replicas or 1) != replicas:
        problems.append(f"its replicas are {cfg.num_replicas or 1}, not {replicas}")
    return problems


async def check_event_stream(
    js: JetStreamContext, name: str, *, node: str, duplicate_window_s: float
) -> StreamConfig:
    """Check, changing nothing, that stream `name` can take `node`'s events; its config.

    For a node that may not manage the stream (`--stream-setup check`, the
    `node` role). Raises `StreamConfigError` saying what is wrong and the
    command that fixes it.
    """
    fix = STREAM_CREATE_HINT.format(stream=name)
    try:
        info = await js.stream_info(name)
    except nats.js.errors.NotFoundError:
        raise StreamConfigError(
            f"JetStream stream {name} does not exist, and this node does not create streams "
            f"(--stream-setup check): create it with `{fix}` and the admin credential"
        ) from None
    problems = stream_problems(
        info.config,
        subjects=node_events_filter(node),
        duplicate_window_s=duplicate_window_s,
        exact_window=False,
    )
    if problems:
        raise StreamConfigError(
            f"JetStream stream {name} cannot take node {node}'s events: "
            + "; ".join(problems)
            + f". This node does not change streams (--stream-setup check): fix it with `{fix}`"
            " and the admin credential"
        )
    return info.config


async def setup_event_stream(
    js: JetStreamContext,
    name: str,
    *,
    node: str,
    manage: bool,
    replicas: int,
    duplicate_window_s: float,
) -> StreamSetup:
    """`ensure_event_stream` if this node manages the stream, else `check_event_stream`."""
    if manage:
        return await ensure_event_stream(
            js, name, replicas=replicas, duplicate_window_s=duplicate_window_s
        )
    cfg = await check_event_stream(js, name, node=node, duplicate_window_s=duplicate_window_s)
    return StreamSetup(cfg)


def unusable_reasons(cfg: StreamConfig) -> list[str]:
    """Why volfsm cannot publish its events to a stream with `cfg` (empty if it can)."""
    problems: list[str] = []
    if cfg.storage not in (StorageType.FILE, None):
        problems.append(
            f"it uses {cfg.storage} storage and volfsm needs file storage "
            "(storage cannot be changed: delete and recreate the stream)"
        )
    if cfg.retention not in (RetentionPolicy.LIMITS, None):
        problems.append(
            f"its retention is {cfg.retention} and volfsm needs limits "
            "(retention cannot be changed: delete and recreate the stream)"
        )
    if cfg.sealed:
        problems.append("it is sealed")
    if cfg.mirror is not None:
        problems.append("it is a mirror and takes no publishes")
    return problems


def may_drop_messages(cfg: StreamConfig) -> bool:
    """True if the stream's own limits may remove events (so a short stream is no loss)."""
    return any(
        (value or 0) > 0
        for value in (cfg.max_age, cfg.max_msgs, cfg.max_bytes, cfg.max_msgs_per_subject)
    )


class _EnvelopeSeq(msgspec.Struct):
    seq: int


_decode_seq = msgspec.json.Decoder(_EnvelopeSeq).decode


async def last_node_seq(js: JetStreamContext, stream: str, node: str) -> int:
    """The log `seq` of the newest event of `node` in `stream` (0 if it holds none).

    Read from the last message on `volfsm.<node>.events.>` (a direct get,
    see the module): its `Nats-Msg-Id` (`<node>:<seq>`), or the envelope's
    `seq` if the header is missing. Nobody answering (the stream was just
    created or updated, or none of its replicas is caught up) is retried a
    few times, then raised as `nats.errors.NoRespondersError`.
    """
    for attempt in range(DIRECT_GET_TRIES):
        try:
            msg = await js.get_last_msg(stream, node_events_filter(node), direct=True)
            break
        except nats.js.errors.NotFoundError:
            return 0
        except nats.errors.NoRespondersError:
            if attempt + 1 == DIRECT_GET_TRIES:
                raise
            await asyncio.sleep(DIRECT_GET_RETRY_S)
    raw_id = (msg.headers or {}).get(MSG_ID_HEADER)
    if raw_id:
        with contextlib.suppress(ValueError):
            id_node, seq = parse_msg_id(raw_id)
            if id_node == node:
                return seq
    try:
        return _decode_seq(msg.data or b"").seq
    except msgspec.DecodeError as exc:
        raise StreamConfigError(
            f"the last message on {node_events_filter(node)} in stream {stream} is not a "
            f"volfsm event (msg id {raw_id!r})"
        ) from exc
