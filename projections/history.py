"""Selecting events for a history listing: by stream, volume, pod, time and type.

All criteria given must hold (streams and types each match any of their
values). "Events of a volume" are its device stream, the pod-volume streams
whose events name it, the desired-state events that name it, and the
PodRemoved and PodCleanedUp of pods that had it. The filter reads the log once, in order:
a pod-volume stream joins the volume at its first event naming the volume
(in practice its first event: OperationStarted and every transition name it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from events.streams import device_stream, pod_stream, stream_kind
from events.types import DesiredSizeChanged, Envelope, PodAdded, PodCleanedUp, PodRemoved


@dataclass(frozen=True, slots=True)
class EventFilter:
    """What a history listing keeps. Empty / None criteria match everything."""

    streams: frozenset[str] = frozenset()
    volume_id: str | None = None
    pod_uid: str | None = None
    pod_uids: frozenset[str] = frozenset()
    """Events of any of these pods (the uids a pod's name had); with `pod_uid`, of either."""
    since_us: int | None = None
    until_us: int | None = None
    types: frozenset[str] = frozenset()


@dataclass(slots=True)
class _VolumeLinks:
    volume_id: str
    podvol_streams: set[str] = field(default_factory=set)
    pods: set[str] = field(default_factory=set)

    def matches(self, env: Envelope) -> bool:
        body = env.body
        if env.stream == device_stream(self.volume_id) or env.stream in self.podvol_streams:
            return True
        if stream_kind(env.stream) == "podvol" and getattr(body, "volume_id", "") == self.volume_id:
            self.podvol_streams.add(env.stream)
            return True
        if isinstance(body, DesiredSizeChanged):
            return body.volume_id == self.volume_id
        if isinstance(body, PodAdded):
            if any(v.volume_id == self.volume_id for v in body.volumes):
                self.pods.add(body.pod_uid)
                return True
            return False
        return isinstance(body, PodRemoved | PodCleanedUp) and body.pod_uid in self.pods


def _in_pod(env: Envelope, pod_uid: str) -> bool:
    return env.stream == pod_stream(pod_uid) or env.stream.startswith(f"podvol/{pod_uid}/")


def _in_any_pod(env: Envelope, flt: EventFilter) -> bool:
    if flt.pod_uid is not None and _in_pod(env, flt.pod_uid):
        return True
    return any(_in_pod(env, uid) for uid in flt.pod_uids)


def select(envelopes: Iterable[Envelope], flt: EventFilter) -> Iterator[Envelope]:
    """The envelopes (in the given order) that `flt` keeps."""
    links = _VolumeLinks(flt.volume_id) if flt.volume_id is not None else None
    for env in envelopes:
        if flt.until_us is not None and env.ts > flt.until_us:
            return
        # Volume links are learnt from every event, even ones other criteria drop.
        if links is not None and not links.matches(env):
            continue
        if flt.since_us is not None and env.ts < flt.since_us:
            continue
        if flt.streams and env.stream not in flt.streams:
            continue
        if (flt.pod_uid is not None or flt.pod_uids) and not _in_any_pod(env, flt):
            continue
        if flt.types and env.type not in flt.types:
            continue
        yield env
