"""Volume health and usage across nodes: "volumes near full" and "abnormal volumes".

Nodes record a `VolumeUsageChanged` when a PVC-backed volume's used share
moves to another 5 % step and a `VolumeConditionChanged` when its CSI
driver reports a different condition (`volfsm.engine.volstats`). This fold
keeps the latest of each per pod-volume of each node, forgets a pod-volume
once it is unmounted, and answers the two report sections:

* `near_full(threshold)`: volumes whose last recorded used share is at or
  above `threshold` (default 0.9), fullest first;
* `abnormal()`: volumes whose driver last said abnormal, longest first.

It reads envelopes (`apply`) or their public JSON form (`apply_json`, as
NATS carries them), so the aggregator can feed it beside `AnalyticsFold`.
Like the kubelet's gauges, one line per (node, namespace, claim).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from events.streams import PODVOL_PREFIX
from events.types import Envelope, VolumeConditionChanged, VolumeUsageChanged

NEAR_FULL = 0.9
"""Default share of capacity from which a volume counts as near full."""

_FORGETS = frozenset({"VolumeUnmounted"})
_OBSERVES = frozenset({"VolumeConditionChanged", "VolumeUsageChanged"})
HEALTH_TYPES = _OBSERVES | _FORGETS
"""The event types the fold reads (every other type it ignores)."""

Key = tuple[str, str, str]
"""(node, pod uid, volume name)."""


@dataclass(slots=True)
class VolumeHealth:
    """The latest usage and condition of one mounted pod-volume on one node."""

    node: str
    pod_uid: str
    volume_name: str
    volume_id: str = ""
    namespace: str = ""
    claim: str = ""
    capacity_bytes: int = 0
    used_bytes: int = 0
    inodes: int = 0
    inodes_used: int = 0
    usage_us: int = 0
    """When the usage was recorded (0: never)."""
    abnormal: bool = False
    message: str = ""
    abnormal_since_us: int = 0

    @property
    def share(self) -> float:
        """Used share of the capacity (0 without a capacity)."""
        return self.used_bytes / self.capacity_bytes if self.capacity_bytes > 0 else 0.0

    @property
    def inode_share(self) -> float:
        """Used share of the inodes (0 without inodes)."""
        return self.inodes_used / self.inodes if self.inodes > 0 else 0.0


@dataclass(frozen=True, slots=True)
class NearFullFigure:
    """A report line of "volumes near full"."""

    node: str
    namespace: str
    claim: str
    volume_id: str
    used_bytes: int
    capacity_bytes: int
    share: float
    inode_share: float
    recorded_us: int


@dataclass(frozen=True, slots=True)
class AbnormalFigure:
    """A report line of "abnormal volumes"."""

    node: str
    namespace: str
    claim: str
    volume_id: str
    pod_uid: str
    volume_name: str
    message: str
    since_us: int


class _Observation(msgspec.Struct, kw_only=True):
    """The fields of either observation body (JSON form)."""

    volume_id: str = ""
    namespace: str = ""
    claim: str = ""
    abnormal: bool = False
    message: str = ""
    capacity_bytes: int = 0
    used_bytes: int = 0
    inodes: int = 0
    inodes_used: int = 0


class _Envelope(msgspec.Struct, kw_only=True):
    stream: str
    type: str
    ts: int
    node: str
    body: _Observation


_decoder = msgspec.json.Decoder(_Envelope)


@dataclass(slots=True)
class HealthFold:
    """Latest usage and condition per (node, pod-volume); see the module doc."""

    volumes: dict[Key, VolumeHealth] = field(default_factory=dict)

    def apply(self, env: Envelope) -> None:
        """Fold one envelope (other event types are ignored, cheaply)."""
        if env.type in _OBSERVES or env.type in _FORGETS:
            body = env.body
            obs = _Observation(
                **{f: getattr(body, f) for f in _Observation.__struct_fields__ if hasattr(body, f)}
            )
            self._fold(env.node, env.stream, env.type, env.ts, obs)

    def apply_json(self, data: bytes | str) -> None:
        """Fold one envelope in its JSON form (only observations and unmounts are decoded)."""
        if isinstance(data, bytes):
            hit = any(name.encode() in data for name in (*_OBSERVES, *_FORGETS))
        else:
            hit = any(name in data for name in (*_OBSERVES, *_FORGETS))
        if not hit:
            return
        env = _decoder.decode(data)
        if env.type in _OBSERVES or env.type in _FORGETS:
            self._fold(env.node, env.stream, env.type, env.ts, env.body)

    def _fold(self, node: str, stream: str, etype: str, ts: int, obs: _Observation) -> None:
        if not stream.startswith(PODVOL_PREFIX):
            return
        uid, _, name = stream[len(PODVOL_PREFIX) :].partition("/")
        key = (node, uid, name)
        if etype in _FORGETS:
            self.volumes.pop(key, None)
            return
        vol = self.volumes.get(key)
        if vol is None:
            vol = self.volumes[key] = VolumeHealth(node, uid, name)
        vol.volume_id = obs.volume_id or vol.volume_id
        vol.namespace, vol.claim = obs.namespace or vol.namespace, obs.claim or vol.claim
        if etype == VolumeUsageChanged.__name__:
            vol.capacity_bytes, vol.used_bytes = obs.capacity_bytes, obs.used_bytes
            vol.inodes, vol.inodes_used = obs.inodes, obs.inodes_used
            vol.usage_us = ts
        elif etype == VolumeConditionChanged.__name__:
            if obs.abnormal and not vol.abnormal:
                vol.abnormal_since_us = ts
            vol.abnormal, vol.message = obs.abnormal, obs.message if obs.abnormal else ""

    # --------------------------------------------------------------- report

    def _per_claim(self, abnormal_only: bool = False) -> list[VolumeHealth]:
        """One entry per (node, namespace, claim): the first pod's, as the kubelet's gauges."""
        seen: dict[tuple[str, str, str], VolumeHealth] = {}
        for vol in self.volumes.values():
            if vol.abnormal or not abnormal_only:
                seen.setdefault((vol.node, vol.namespace, vol.claim or vol.volume_id), vol)
        return list(seen.values())

    def near_full(self, threshold: float = NEAR_FULL) -> list[NearFullFigure]:
        """Volumes at or above `threshold` of their bytes or inodes, fullest first."""
        found = [
            NearFullFigure(
                v.node,
                v.namespace,
                v.claim,
                v.volume_id,
                v.used_bytes,
                v.capacity_bytes,
                v.share,
                v.inode_share,
                v.usage_us,
            )
            for v in self._per_claim()
            if v.usage_us and max(v.share, v.inode_share) >= threshold
        ]
        return sorted(found, key=lambda f: (-max(f.share, f.inode_share), f.node, f.claim))

    def abnormal(self) -> list[AbnormalFigure]:
        """Volumes whose driver last reported them abnormal, abnormal longest first."""
        found = [
            AbnormalFigure(
                v.node,
                v.namespace,
                v.claim,
                v.volume_id,
                v.pod_uid,
                v.volume_name,
                v.message,
                v.abnormal_since_us,
            )
            for v in self._per_claim(abnormal_only=True)
        ]
        return sorted(found, key=lambda f: (f.since_us, f.node, f.claim))
