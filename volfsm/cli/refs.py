"""Naming a pod, a volume or a stream the same way in every command, and checking it.

A pod is `NAMESPACE/NAME` or its uid everywhere (`NAME` alone means
`default/NAME` when it is no uid). Offline commands check what they are
given against the log: a pod, volume or stream the log never saw is an
error that lists what the log has (exit 2), never an empty listing that
reads as "nothing happened". A `NAMESPACE/NAME` means every pod of that
name the log saw (a StatefulSet pod keeps its name across uids), newest last.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from events.streams import DEVICE_PREFIX, POD_PREFIX

if TYPE_CHECKING:
    from events.log import EventLog

SHOWN = 8
"""How many names an error lists before saying how many more there are."""
DEFAULT_NAMESPACE = "default"


class UnknownNameError(LookupError):
    """Something named on the command line is not in the log (or on the node)."""


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod as given: `text`, and the namespace and name it would be (None: no name form)."""

    text: str
    namespace: str | None
    name: str | None


def parse_pod(text: str) -> PodRef:
    """'ns/name', 'name' (in default, unless it is a uid) or a uid.

    ValueError for an empty part or more than one '/'.
    """
    namespace, sep, name = text.partition("/")
    if not sep:
        if not text:
            raise ValueError("expected NAMESPACE/NAME or a pod uid, got ''")
        return PodRef(text, DEFAULT_NAMESPACE, text)
    if not namespace or not name or "/" in name:
        raise ValueError(f"expected NAMESPACE/NAME or a pod uid, got {text!r}")
    return PodRef(text, namespace, name)


def listing(names: Iterable[str], limit: int = SHOWN) -> str:
    """'a, b, c' or 'a, b, ... (12 more)'; 'none' when empty."""
    items = list(names)
    if not items:
        return "none"
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown}, ... ({len(items) - limit} more)"


@dataclass(frozen=True, slots=True)
class KnownPod:
    """A pod the log has a PodAdded (or PodPending) of."""

    uid: str
    namespace: str
    name: str
    added_seq: int

    @property
    def label(self) -> str:
        """'namespace/name'."""
        return f"{self.namespace}/{self.name}"


class _PodView(msgspec.Struct):
    pod_uid: str = ""
    namespace: str = ""
    name: str = ""


_pod_view = msgspec.msgpack.Decoder(_PodView)


def known_pods(log: EventLog) -> dict[str, KnownPod]:
    """Every pod with a PodAdded or PodPending in the log, by uid (with the seq of its first)."""
    pods: dict[str, KnownPod] = {}
    with log.scan_rows(prefix=POD_PREFIX) as rows:
        for seq, _stream, _version, type_name, _schema, _ts, body in rows:
            if type_name not in _DESIRING:
                continue
            view = _pod_view.decode(body)
            known = pods.get(view.pod_uid)
            first = known.added_seq if known is not None else seq
            pods[view.pod_uid] = KnownPod(view.pod_uid, view.namespace, view.name, first)
    return pods


_DESIRING = frozenset({"PodAdded", "PodPending"})
"""The events that put a pod into the desired state (a pending one waits for objects)."""


def match_pods(pods: Sequence[KnownPod], ref: PodRef) -> list[KnownPod]:
    """The pods `ref` names: the one with that uid, else every one of that name, oldest first."""
    same_uid = [p for p in pods if p.uid == ref.text]
    if same_uid:
        return same_uid
    named = [p for p in pods if (p.namespace, p.name) == (ref.namespace, ref.name)]
    return sorted(named, key=lambda p: p.added_seq)


def unknown_pod(ref: PodRef, pods: Iterable[KnownPod], where: str) -> UnknownNameError:
    """'no pod shop/web-0 in this log; pods it has: a/b, c/d'."""
    shown = ref.text if "/" in ref.text else f"{ref.text} (uid, or {ref.namespace}/{ref.name})"
    labels = sorted({p.label for p in pods})
    return UnknownNameError(f"no pod {shown} {where}; pods it has: {listing(labels)}")


def resolve_pods(log: EventLog, text: str) -> list[KnownPod]:
    """The pods of the log `text` names (see `match_pods`); UnknownNameError listing them."""
    ref = parse_pod(text)
    pods = list(known_pods(log).values())
    found = match_pods(pods, ref)
    if not found:
        raise unknown_pod(ref, pods, "in this log")
    return found


def known_volumes(log: EventLog) -> list[str]:
    """Every volume the log has a device stream of, sorted."""
    return [s[len(DEVICE_PREFIX) :] for s in log.streams() if s.startswith(DEVICE_PREFIX)]


def check_volume(log: EventLog, volume_id: str) -> None:
    """UnknownNameError listing the log's volumes if `volume_id` has no events in it."""
    volumes = known_volumes(log)
    if volume_id in volumes:
        return
    pods = known_pods(log)
    if any(_wants(log, uid, volume_id) for uid in pods):
        return
    raise UnknownNameError(f"no volume {volume_id} in this log; volumes it has: {listing(volumes)}")


def _wants(log: EventLog, uid: str, volume_id: str) -> bool:
    """Whether the pod's desired-state events name the volume (wanted, never attached)."""
    return any(
        volume_id in {v.volume_id for v in getattr(env.body, "volumes", ())}
        for env in log.read_stream(POD_PREFIX + uid)
    )


def check_streams(log: EventLog, streams: Iterable[str]) -> None:
    """UnknownNameError naming the first stream the log does not have, and a few it has."""
    for stream in streams:
        if not log.has_stream(stream):
            names = log.streams()
            raise UnknownNameError(
                f"no stream {stream} in this log; it has {len(names)}: {listing(names)}"
            )
