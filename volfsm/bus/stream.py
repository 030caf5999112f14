"""The JetStream event stream: create it, check it, and find a node's last event in it."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import msgspec
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from events.subjects import EVENTS_WILDCARD, node_events_filter, parse_msg_id, subject_covers
from volfsm.bus.errors import StreamConfigError

MSG_ID_HEADER = "Nats-Msg-Id"


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
    )


async def ensure_event_stream(
    js: JetStreamContext, name: str, *, replicas: int, duplicate_window_s: float
) -> StreamSetup:
    """Create stream `name`, or check it and update what can safely change.

    Subjects (ours added), replicas and the duplicate window are updated;
    storage, retention, sealed and mirror streams cannot be used and raise
    `StreamConfigError`, as does a server refusing the create or update.
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
    return changes


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

    Read from the last message on `volfsm.<node>.events.>`: its `Nats-Msg-Id`
    (`<node>:<seq>`), or the envelope's `seq` if the header is missing.
    """
    try:
        msg = await js.get_last_msg(stream, node_events_filter(node))
    except nats.js.errors.NotFoundError:
        return 0
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
