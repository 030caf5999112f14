"""A realistic sample history, so a new user can try every read command at once.

`write_demo` drives the command handler (the one writer of events) through
a few minutes of a node's life, stamped by a fake clock so the history ends
"now" (or at `end_us`) and is identical for the same `seed`:

* pod shop/web-0 with a CSI volume and an emptyDir; NodeStage times out
  (DeadlineExceeded -> Uncertain), fails once more (Unavailable), then
  succeeds after the 0.5 s and 1 s backoffs; both volumes are published;
* pod analytics/report-0 shares the CSI volume (read-only);
* the volume is expanded from 10 GiB to 20 GiB;
* pod monitoring/metrics-0 arrives with its own CSI volume and an emptyDir;
* pod shop/cart-0 is applied before its claim and waits (PodPending): first
  for the claim, then for the PV the claim is bound to; once the PV is
  applied it resolves (PodAdded) and its volume is published;
* web-0 and report-0 are deleted: unpublish, an unstage that fails
  ("target is busy" -> Uncertain), a retry that succeeds, detach;
* pod ci/builder-7's publish times out (Uncertain) and the retry is still
  in flight when the log ends.
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from events.errors import NotAVolfsmLogError
from events.log import EventLog
from events.streams import device_stream, object_stream, pod_stream, podvol_stream, stream_kind
from events.tables import TABLES
from events.types import (
    Body,
    DesiredSizeChanged,
    DesiredVolume,
    DeviceAttached,
    DeviceDetached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    ObjectApplied,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PendingVolume,
    PodAdded,
    PodPending,
    PodRemoved,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeResized,
    VolumeSource,
    VolumeUnmounted,
)
from volfsm.engine.handler import CommandHandler
from volfsm.errors import VolfsmError

DEMO_NODE = "demo-node"
CSI_DRIVER = "csi.volfsm.example"
CSI_PLUGIN = "kubernetes.io/csi"
EMPTY_DIR_PLUGIN = "kubernetes.io/empty-dir"
KUBELET_DIR = "/var/lib/kubelet"
GIB = 1024**3

_Error = tuple[str, str, float]
"""A failure in the scenario: (gRPC code, message, backoff seconds)."""


class LogNotEmptyError(VolfsmError):
    """The demo's target already holds events and `force` was not given."""


@dataclass(frozen=True)
class Step:
    """One append of the scenario: wait `after_s`, then write `bodies` to `stream`."""

    after_s: float
    stream: str
    bodies: tuple[Body, ...]
    transition: bool


@dataclass(frozen=True)
class DemoResult:
    """What `write_demo` wrote."""

    path: Path
    events: int
    last_seq: int
    start_us: int
    end_us: int


@dataclass
class _Pod:
    uid: str
    namespace: str
    name: str
    volumes: tuple[DesiredVolume, ...] = ()

    def added(self) -> PodAdded:
        return PodAdded(
            pod_uid=self.uid, namespace=self.namespace, name=self.name, volumes=self.volumes
        )

    def removed(self) -> PodRemoved:
        return PodRemoved(pod_uid=self.uid, namespace=self.namespace, name=self.name)

    def pending(self, *waiting: PendingVolume) -> PodPending:
        return PodPending(
            pod_uid=self.uid, namespace=self.namespace, name=self.name, waiting=waiting
        )


@dataclass
class _Script:
    """Builds the list of steps; knows nothing about the log."""

    rng: random.Random
    steps: list[Step] = field(default_factory=list)
    _delay: float = 0.0

    def uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def wait(self, seconds: float, *, jitter: bool = True) -> None:
        factor = self.rng.uniform(0.85, 1.15) if jitter else 1.0
        self._delay += round(seconds * factor, 3)

    def _add(self, stream: str, bodies: tuple[Body, ...], transition: bool) -> None:
        self.steps.append(Step(self._delay, stream, bodies, transition))
        self._delay = 0.0

    def fire(self, stream: str, body: Body) -> None:
        self._add(stream, (body,), True)

    def record(self, stream: str, *bodies: Body) -> None:
        self._add(stream, bodies, False)

    def start(self, stream: str, operation: str, volume_id: str, pod_uid: str = "") -> str:
        op_id = self.uid()
        plugin = EMPTY_DIR_PLUGIN if volume_id.startswith("emptydir-") else CSI_PLUGIN
        self.record(
            stream,
            OperationStarted(
                op_id=op_id,
                operation=operation,
                volume_id=volume_id,
                pod_uid=pod_uid,
                plugin=plugin,
            ),
        )
        return op_id

    def run_ok(
        self,
        stream: str,
        operation: str,
        volume_id: str,
        seconds: float,
        *result: Body,
        pod_uid: str = "",
    ) -> None:
        """An operation that succeeds after about `seconds`, recording `result` transitions."""
        op_id = self.start(stream, operation, volume_id, pod_uid)
        self.wait(seconds)
        for body in result:
            self.fire(stream, body)
        self.wait(0.002, jitter=False)
        self.record(
            stream,
            OperationSucceeded(op_id=op_id, operation=operation, duration_s=round(seconds, 3)),
        )

    def run_failed(
        self,
        stream: str,
        operation: str,
        volume_id: str,
        seconds: float,
        error: _Error,
        uncertain: Body,
        pod_uid: str = "",
    ) -> None:
        """A non-final failure after `seconds`: mark Uncertain, record the error and backoff."""
        code, message, backoff_s = error
        op_id = self.start(stream, operation, volume_id, pod_uid)
        self.wait(seconds, jitter=False)
        self.fire(stream, uncertain)
        self.wait(0.001, jitter=False)
        self.record(
            stream,
            OperationFailed(
                op_id=op_id,
                operation=operation,
                code=code,
                message=message,
                final=False,
                backoff_s=backoff_s,
                duration_s=seconds,
            ),
        )
        self.wait(backoff_s, jitter=False)


def _csi_volume(
    name: str, pv: str, claim: str, size: int, read_only: bool = False
) -> DesiredVolume:
    return DesiredVolume(
        name=name,
        volume_id=pv,
        pv_name=pv,
        claim_name=claim,
        size_bytes=size,
        read_only=read_only,
        source=VolumeSource(
            plugin=CSI_PLUGIN,
            driver=CSI_DRIVER,
            volume_handle=f"vol-{pv[4:12]}",
            fs_type="ext4",
            access_modes=("ReadWriteMany",),
            mount_options=("noatime",),
        ),
    )


def _empty_dir(pod_uid: str, name: str, limit: int | None = None) -> DesiredVolume:
    return DesiredVolume(
        name=name,
        volume_id=f"emptydir-{pod_uid}-{name}",
        source=VolumeSource(plugin=EMPTY_DIR_PLUGIN, size_limit_bytes=limit),
    )


def _staging_path(volume: DesiredVolume) -> str:
    digest = hashlib.sha256(volume.source.volume_handle.encode()).hexdigest()
    return f"{KUBELET_DIR}/plugins/{CSI_PLUGIN}/{CSI_DRIVER}/{digest}/globalmount"


def _publish_path(pod_uid: str, volume: DesiredVolume) -> str:
    escaped = volume.source.plugin.replace("kubernetes.io/", "kubernetes.io~")
    suffix = "/mount" if volume.source.plugin == CSI_PLUGIN else ""
    return f"{KUBELET_DIR}/pods/{pod_uid}/volumes/{escaped}/{volume.name}{suffix}"


class _Node:
    """Scenario vocabulary on top of `_Script`: attach, stage, publish, tear down."""

    def __init__(self, script: _Script) -> None:
        self.s = script

    def attach(self, vol: DesiredVolume) -> None:
        dev = device_stream(vol.volume_id)
        if vol.source.plugin == EMPTY_DIR_PLUGIN:
            self.s.fire(dev, DeviceAttached(volume_id=vol.volume_id, plugin=EMPTY_DIR_PLUGIN))
            return
        attached = DeviceAttached(volume_id=vol.volume_id, plugin=CSI_PLUGIN, attachable=True)
        self.s.run_ok(dev, "verify_controller_attached_volume", vol.volume_id, 0.3, attached)
        if vol.size_bytes is not None:
            self.s.fire(dev, VolumeResized(volume_id=vol.volume_id, size_bytes=vol.size_bytes))

    def stage(self, vol: DesiredVolume, seconds: float) -> None:
        mounted = DeviceMounted(
            volume_id=vol.volume_id, device_mount_path=_staging_path(vol), mount_found=True
        )
        self.s.run_ok(device_stream(vol.volume_id), "mount_device", vol.volume_id, seconds, mounted)

    def stage_fails(
        self, vol: DesiredVolume, seconds: float, error: tuple[str, str, float]
    ) -> None:
        uncertain = DeviceMountUncertain(
            volume_id=vol.volume_id,
            reason=f"NodeStageVolume: {error[0]}",
            device_mount_path=_staging_path(vol),
        )
        dev = device_stream(vol.volume_id)
        self.s.run_failed(dev, "mount_device", vol.volume_id, seconds, error, uncertain)

    def publish(self, pod: _Pod, vol: DesiredVolume, seconds: float) -> None:
        mounted = VolumeMounted(
            volume_id=vol.volume_id,
            pod_uid=pod.uid,
            volume_name=vol.name,
            mount_path=_publish_path(pod.uid, vol),
            mount_found=True,
        )
        stream = podvol_stream(pod.uid, vol.name)
        self.s.run_ok(stream, "volume_mount", vol.volume_id, seconds, mounted, pod_uid=pod.uid)

    def unpublish(self, pod: _Pod, vol: DesiredVolume, seconds: float) -> None:
        unmounted = VolumeUnmounted(volume_id=vol.volume_id, pod_uid=pod.uid, volume_name=vol.name)
        stream = podvol_stream(pod.uid, vol.name)
        self.s.run_ok(stream, "volume_unmount", vol.volume_id, seconds, unmounted, pod_uid=pod.uid)

    def detach(self, vol: DesiredVolume) -> None:
        self.s.fire(device_stream(vol.volume_id), DeviceDetached(volume_id=vol.volume_id))


def _object_created(s: _Script, kind: str, namespace: str, name: str, rv: int) -> None:
    """An apply of a claim or PV (its content hash made up from the seed)."""
    body = ObjectApplied(
        kind=kind,
        namespace=namespace,
        name=name,
        uid=s.uid(),
        resource_version=rv,
        content_hash=f"sha256:{s.rng.getrandbits(256):064x}",
    )
    s.record(object_stream(kind, namespace, name), body)


def _waits_for_claim(s: _Script, node: _Node) -> None:
    """shop/cart-0 waits for its claim, then for the claim's PV; resolved, then published."""
    cart = _Pod(s.uid(), "shop", "cart-0")
    data = _csi_volume("data", f"pvc-{s.uid()}", "cart-data", 2 * GIB)
    cart.volumes = (data,)
    claim = f"PersistentVolumeClaim shop/{data.claim_name}"
    s.record(
        pod_stream(cart.uid),
        cart.pending(PendingVolume(name="data", waits_for=claim, reason="not found yet")),
    )
    s.wait(20)
    _object_created(s, "PersistentVolumeClaim", "shop", data.claim_name, 7)
    no_pv = PendingVolume(
        name="data",
        waits_for=f"PersistentVolume {data.pv_name}",
        reason=f"not found yet ({claim} is bound to it)",
        needs=(claim,),
    )
    s.record(pod_stream(cart.uid), cart.pending(no_pv))
    s.wait(12)
    _object_created(s, "PersistentVolume", "", data.pv_name, 8)
    s.record(pod_stream(cart.uid), cart.added())
    s.wait(0.05)
    node.attach(data)
    node.stage(data, 1.6)
    node.publish(cart, data, 0.5)


def build_scenario(rng: random.Random) -> list[Step]:
    """The demo's steps; pure (no I/O), fully determined by `rng`."""
    s = _Script(rng)
    node = _Node(s)
    web = _Pod(s.uid(), "shop", "web-0")
    data = _csi_volume("data", f"pvc-{s.uid()}", "web-data", 10 * GIB)
    web.volumes = (data, _empty_dir(web.uid, "cache", GIB))
    cache = web.volumes[1]

    s.record(pod_stream(web.uid), web.added())
    s.wait(0.8)
    node.attach(data)
    node.attach(cache)
    node.publish(web, cache, 0.05)
    deadline = ("DeadlineExceeded", "NodeStageVolume: context deadline exceeded", 0.5)
    node.stage_fails(data, 15.0, deadline)
    unavailable = ("Unavailable", "NodeStageVolume: driver is restarting", 1.0)
    node.stage_fails(data, 3.0, unavailable)
    node.stage(data, 2.4)
    node.publish(web, data, 0.6)

    s.wait(35)
    report = _Pod(s.uid(), "analytics", "report-0")
    shared = _csi_volume("data", data.volume_id, "web-data", 10 * GIB, read_only=True)
    report.volumes = (shared,)
    s.record(pod_stream(report.uid), report.added())
    s.wait(0.5)
    node.publish(report, shared, 0.4)

    s.wait(50)
    s.record(pod_stream(web.uid), DesiredSizeChanged(volume_id=data.volume_id, size_bytes=20 * GIB))
    s.wait(1.0)
    grown = VolumeResized(volume_id=data.volume_id, size_bytes=20 * GIB)
    s.run_ok(device_stream(data.volume_id), "expand_volume", data.volume_id, 4.0, grown)

    s.wait(45)
    metrics = _Pod(s.uid(), "monitoring", "metrics-0")
    tsdb = _csi_volume("tsdb", f"pvc-{s.uid()}", "metrics-tsdb", 5 * GIB)
    metrics.volumes = (tsdb, _empty_dir(metrics.uid, "scratch"))
    scratch = metrics.volumes[1]
    s.record(pod_stream(metrics.uid), metrics.added())
    s.wait(0.6)
    node.attach(tsdb)
    node.attach(scratch)
    node.publish(metrics, scratch, 0.04)
    node.stage(tsdb, 1.8)
    node.publish(metrics, tsdb, 0.5)

    s.wait(10)
    _waits_for_claim(s, node)

    s.wait(20)
    s.record(pod_stream(web.uid), web.removed())
    s.wait(0.4)
    node.unpublish(web, data, 0.3)
    node.unpublish(web, cache, 0.1)
    s.wait(0.2)
    node.detach(cache)

    s.wait(30)
    s.record(pod_stream(report.uid), report.removed())
    s.wait(0.4)
    node.unpublish(report, shared, 0.3)
    busy = DeviceMountUncertain(volume_id=data.volume_id, reason="NodeUnstageVolume: Internal")
    error = ("Internal", "NodeUnstageVolume: umount: target is busy", 0.5)
    dev = device_stream(data.volume_id)
    s.run_failed(dev, "unmount_device", data.volume_id, 2.0, error, busy)
    unstaged = DeviceUnmounted(volume_id=data.volume_id, reason="NodeUnstageVolume succeeded")
    s.run_ok(dev, "unmount_device", data.volume_id, 1.1, unstaged)
    s.wait(0.2)
    node.detach(data)

    s.wait(20)
    builder = _Pod(s.uid(), "ci", "builder-7")
    workspace = _csi_volume("workspace", f"pvc-{s.uid()}", "builder-ws", 50 * GIB)
    builder.volumes = (workspace,)
    s.record(pod_stream(builder.uid), builder.added())
    s.wait(0.5)
    node.attach(workspace)
    node.stage(workspace, 2.2)
    timed_out = VolumeMountUncertain(
        volume_id=workspace.volume_id,
        pod_uid=builder.uid,
        volume_name=workspace.name,
        reason="NodePublishVolume: DeadlineExceeded",
    )
    ws_stream = podvol_stream(builder.uid, workspace.name)
    deadline = ("DeadlineExceeded", "NodePublishVolume: context deadline exceeded", 0.5)
    s.run_failed(
        ws_stream, "volume_mount", workspace.volume_id, 15.0, deadline, timed_out, builder.uid
    )
    s.start(ws_stream, "volume_mount", workspace.volume_id, builder.uid)
    return s.steps


class _StepClock:
    """A fake clock the demo moves forward between steps (UTC µs)."""

    def __init__(self, start_us: int) -> None:
        self.now_us = start_us

    def advance(self, seconds: float) -> None:
        self.now_us += round(seconds * 1_000_000)

    def __call__(self) -> int:
        return self.now_us


def _trigger_for(stream: str, event_type: str) -> str:
    table = TABLES[stream_kind(stream)]
    return next(t.trigger for t in table.transitions if t.event == event_type)


DEMO_CURSOR = "volfsm-demo"
"""A cursor only `write_demo` sets: the mark of a log that holds nothing but the demo."""


class NotADemoLogError(LogNotEmptyError):
    """The target is a log something else wrote (a service): never replaced, even with force."""


def written_by_demo(log: EventLog) -> bool:
    """Whether `log` is a demo log: marked so, or (older demos) the demo node and never relayed."""
    cursors = log.cursors()
    if DEMO_CURSOR in cursors:
        return True
    relayed = any(name.startswith("relay:") for name in cursors)
    return log.node == DEMO_NODE and not relayed


def _prepare_target(path: Path, force: bool) -> None:
    """Refuse to clobber a non-empty log (unless `force` and it is a demo log) or anything
    that is not a log; a log a service wrote is never replaced."""
    if not path.exists() or path.stat().st_size == 0:
        return
    reader = EventLog(path, readonly=True)  # raises for a foreign or newer file
    try:
        events = reader.last_seq()
        demo = written_by_demo(reader)
        node = reader.node
    finally:
        reader.close()
    if events == 0:
        return
    if not demo:
        raise NotADemoLogError(
            f"{path}: holds {events} events of node {node or '?'} that volfsm demo did not write"
            " (a service's log): it is never replaced, not even with --force; write the demo"
            " elsewhere, e.g. volfsm demo --data-dir /tmp/volfsm-demo"
        )
    if not force:
        raise LogNotEmptyError(
            f"{path}: already holds {events} events; pass --force to replace it with the demo"
        )
    EventLog(path).close()  # fails with LogLockedError while a service has it open
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


def write_demo(
    path: str | Path,
    *,
    seed: int | None = None,
    end_us: int | None = None,
    force: bool = False,
    node: str = DEMO_NODE,
) -> DemoResult:
    """Write the sample history to the log at `path` (created with its parent dirs).

    The same `seed` and `end_us` give the same events, timestamps and ids.
    Raises `LogNotEmptyError` if the log already holds events and not `force`;
    a file that is not a volfsm log is never touched.
    """
    target = Path(path)
    if target.is_dir():
        raise NotAVolfsmLogError(f"{target}: is a directory, not a volfsm event log")
    target.parent.mkdir(parents=True, exist_ok=True)
    _prepare_target(target, force)
    steps = build_scenario(random.Random(seed))
    end = end_us if end_us is not None else time.time_ns() // 1000
    start = end - round(sum(step.after_s for step in steps) * 1_000_000)
    clock = _StepClock(start)
    log = EventLog(target, node=node, clock=clock)
    try:
        handler = CommandHandler(log)
        count = 0
        for step in steps:
            clock.advance(step.after_s)
            if step.transition:
                body = step.bodies[0]
                handler.fire(step.stream, _trigger_for(step.stream, type(body).__name__), body)
            else:
                handler.record(step.stream, step.bodies)
            count += len(step.bodies)
        last_seq = log.last_seq()
        log.set_cursor(DEMO_CURSOR, last_seq)
    finally:
        log.close()
    return DemoResult(path=target, events=count, last_seq=last_seq, start_us=start, end_us=end)
