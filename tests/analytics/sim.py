"""Simulated volfsm nodes: event histories built like a node's log, and published like its relay.

`SimNode` stamps envelopes with the node's own seq, per-stream versions and
a clock it advances by hand. `mixed_workload` writes a deterministic mix of
what the engine writes: pods added, volumes staged and published (some
timing out into Uncertain and retried, some failing finally), unpublished,
unstaged, expanded, and a reconstruction after a "restart".
`publish` sends envelopes on NATS exactly as the relay does.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from nats.js import JetStreamContext
from nats.js.api import PubAck

from events.codec import envelope_to_json
from events.streams import device_stream, pod_stream, podvol_stream
from events.subjects import events_subject, msg_id
from events.types import (
    Body,
    DesiredVolume,
    DeviceAttached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    Envelope,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    PodRemoved,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeResized,
    VolumeSource,
    VolumeUnmounted,
)

T0 = 1_700_000_000_000_000
"""Start of simulated time (UTC µs)."""

STREAM = "VOLFSM"
DRIVERS = ("ebs.csi.aws.com", "pd.csi.storage.gke.io", "nfs.csi.k8s.io")


def csi_vid(driver: str, handle: str) -> str:
    """The unique volume id of a CSI volume."""
    return f"kubernetes.io/csi/{driver}^{handle}"


def csi_plugin(driver: str) -> str:
    """The engine's plugin label of a CSI driver."""
    return f"kubernetes.io/csi:{driver}"


def desired(name: str, driver: str, handle: str) -> DesiredVolume:
    """One CSI volume of a pod."""
    return DesiredVolume(
        name=name,
        volume_id=csi_vid(driver, handle),
        source=VolumeSource(plugin="kubernetes.io/csi", driver=driver, volume_handle=handle),
    )


@dataclass
class SimNode:
    """One node's log: seq, versions and time as the log assigns them."""

    name: str
    now_us: int = T0
    envs: list[Envelope] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    seq: int = 0
    """The last seq given (`envs` may be emptied by a caller that streams them)."""

    def at(self, seconds: float, stream: str, body: Body) -> Envelope:
        """Append `body` to `stream` at T0 + `seconds` (never before the last event)."""
        self.now_us = max(self.now_us, T0 + round(seconds * 1_000_000))
        return self.emit(stream, body)

    def emit(self, stream: str, body: Body, advance_us: int = 0) -> Envelope:
        """Append `body` to `stream`, `advance_us` after the last event."""
        self.now_us += advance_us
        version = self.versions.get(stream, 0) + 1
        self.versions[stream] = version
        self.seq += 1
        env = Envelope(
            seq=self.seq,
            stream=stream,
            version=version,
            type=type(body).__name__,
            schema=type(body).SCHEMA,
            ts=self.now_us,
            node=self.name,
            body=body,  # type: ignore[arg-type]
        )
        self.envs.append(env)
        return env


def _mount(node: SimNode, rng: random.Random, uid: str, dv: DesiredVolume, driver: str) -> None:
    """A volume_mount: maybe a timeout into Uncertain and a retry; stage, publish."""
    pv = podvol_stream(uid, dv.name)
    dev = device_stream(dv.volume_id)
    plugin = csi_plugin(driver)
    attempt = 0
    while True:
        attempt += 1
        op = f"{node.name}-{uid}-{dv.name}-m{attempt}"
        node.emit(
            pv,
            OperationStarted(
                op_id=op,
                operation="volume_mount",
                volume_id=dv.volume_id,
                pod_uid=uid,
                plugin=plugin,
            ),
            rng.randint(1_000, 50_000),
        )
        start = node.now_us
        if attempt == 1:
            node.emit(dev, DeviceAttached(volume_id=dv.volume_id, plugin=plugin), 1_000)
        roll = rng.random()
        if roll < 0.12 and attempt < 3:
            node.emit(
                pv,
                VolumeMountUncertain(
                    volume_id=dv.volume_id, pod_uid=uid, volume_name=dv.name, reason="timeout"
                ),
                rng.randint(100_000, 2_000_000),
            )
            node.emit(
                pv,
                OperationFailed(
                    op_id=op,
                    operation="volume_mount",
                    code="DeadlineExceeded",
                    message="timed out",
                    final=False,
                    duration_s=(node.now_us - start) / 1e6,
                ),
            )
            continue
        if roll < 0.16 and attempt < 3:
            node.emit(
                pv,
                OperationFailed(
                    op_id=op,
                    operation="volume_mount",
                    code=rng.choice(("InvalidArgument", "NotFound")),
                    message="refused",
                    final=True,
                    duration_s=0.01,
                ),
                10_000,
            )
            continue
        if attempt == 1 or roll < 0.5:
            node.emit(dev, DeviceMounted(volume_id=dv.volume_id), rng.randint(10_000, 900_000))
        node.emit(
            pv,
            VolumeMounted(volume_id=dv.volume_id, pod_uid=uid, volume_name=dv.name),
            rng.randint(10_000, 900_000),
        )
        node.emit(
            pv,
            OperationSucceeded(
                op_id=op, operation="volume_mount", duration_s=(node.now_us - start) / 1e6
            ),
        )
        return


def _simple_op(
    node: SimNode,
    rng: random.Random,
    stream: str,
    op: str,
    operation: str,
    vid: str,
    driver: str,
    outcome: Body,
) -> None:
    node.emit(
        stream,
        OperationStarted(op_id=op, operation=operation, volume_id=vid, plugin=csi_plugin(driver)),
        rng.randint(1_000, 30_000),
    )
    start = node.now_us
    node.emit(stream, outcome, rng.randint(10_000, 400_000))
    node.emit(
        stream,
        OperationSucceeded(op_id=op, operation=operation, duration_s=(node.now_us - start) / 1e6),
    )


def mixed_workload(node: SimNode, pods: int, seed: int) -> None:
    """Append a deterministic mixed history of `pods` pods (about 20 events a pod)."""
    rng = random.Random(seed)
    for i in range(pods):
        uid = f"{node.name}-pod{i}"
        vols = [
            desired(f"v{j}", rng.choice(DRIVERS), f"{node.name}-h{i}-{j}")
            for j in range(rng.choice((1, 1, 2)))
        ]
        node.emit(
            pod_stream(uid),
            PodAdded(pod_uid=uid, namespace="ns", name=f"p{i}", volumes=tuple(vols)),
            rng.randint(1_000, 200_000),
        )
        for dv in vols:
            _mount(node, rng, uid, dv, dv.source.driver)
        if rng.random() < 0.3:
            dv = vols[0]
            _simple_op(
                node,
                rng,
                device_stream(dv.volume_id),
                f"{uid}-x",
                "volume_fs_resize",
                dv.volume_id,
                dv.source.driver,
                VolumeResized(volume_id=dv.volume_id, size_bytes=2 << 30),
            )
        if rng.random() < 0.05:
            dv = vols[0]
            node.emit(
                device_stream(dv.volume_id),
                DeviceMountUncertain(volume_id=dv.volume_id, reason="restart", reconstructed=True),
                rng.randint(1_000, 50_000),
            )
            node.emit(device_stream(dv.volume_id), DeviceMounted(volume_id=dv.volume_id), 5_000)
        node.emit(
            pod_stream(uid),
            PodRemoved(pod_uid=uid, namespace="ns", name=f"p{i}"),
            rng.randint(1_000, 100_000),
        )
        for dv in vols:
            _simple_op(
                node,
                rng,
                podvol_stream(uid, dv.name),
                f"{uid}-{dv.name}-u",
                "volume_unmount",
                dv.volume_id,
                dv.source.driver,
                VolumeUnmounted(volume_id=dv.volume_id, pod_uid=uid, volume_name=dv.name),
            )
            _simple_op(
                node,
                rng,
                device_stream(dv.volume_id),
                f"{uid}-{dv.name}-d",
                "unmount_device",
                dv.volume_id,
                dv.source.driver,
                DeviceUnmounted(volume_id=dv.volume_id, reason="unstaged"),
            )


def interleave(nodes: Sequence[Sequence[Envelope]]) -> list[Envelope]:
    """Every node's envelopes, round-robin (each node's stay in seq order)."""
    out: list[Envelope] = []
    longest = max((len(n) for n in nodes), default=0)
    for i in range(longest):
        for envs in nodes:
            if i < len(envs):
                out.append(envs[i])
    return out


async def publish(js: JetStreamContext, envs: Iterable[Envelope], window: int = 2000) -> int:
    """Publish envelopes as the relay does (subject, Nats-Msg-Id, JSON body); how many."""
    pending: list[asyncio.Future[PubAck]] = []
    count = 0
    for env in envs:
        fut = await js.publish_async(
            events_subject(env.node, env.type),
            envelope_to_json(env),
            headers={"Nats-Msg-Id": msg_id(env.node, env.seq)},
        )
        pending.append(fut)
        count += 1
        if len(pending) >= window:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return count
