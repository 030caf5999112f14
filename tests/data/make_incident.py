"""Write tests/data/incident.db: a recorded incident, shaped like the engine's own logs.

Run `python tests/data/make_incident.py [OUT]` (default: incident.db beside
this file). The history is fixed: a fake clock stamps every event, ids are
literals, so the events are the same on every run. Events are written
through `CommandHandler` (transitions checked by the FSMs) into an
`EventLog(clock=...)`; the file is then switched to a rollback journal and
vacuumed so readers need no -wal/-shm beside it.

The story (node-7, from 2024-05-01T03:10:00Z, about two minutes):

* monitoring/metrics-0 mounts its CSI volume `tsdb` and stays healthy;
  later it is expanded online from 5 GiB to 8 GiB.
* shop/web-0 (CSI `data` + emptyDir `cache`): NodeStage times out
  (DeadlineExceeded -> device Uncertain), times out again, fails with
  Unavailable while the driver restarts, each retry after a growing backoff
  (0.5 s, 1 s, 2 s); the fourth attempt stages, but the publish times out
  (pod volume Uncertain). The pod is deleted while `data` is Uncertain:
  `cache` is unmounted and its device detached; the unpublish of `data` is
  still run, fails twice ("target is busy"), then succeeds; the unstage
  fails with a final FailedPrecondition (device Uncertain), is retried and
  succeeds; the device is detached.
* batch/report-1 (CSI `input`): the first publish times out (Uncertain);
  the retry fails with a final InvalidArgument, which moves Uncertain back
  to Unmounted; every later retry fails the same way with the backoff
  doubling up to 64 s: the log ends while it is backing off.
* shop/cart-0 (CSI `data`) is applied before its claim: it waits
  (PodPending: the claim shop/cart-data is not found yet); the claim is
  applied, bound to a PV not applied yet, so it waits for the PV; the PV
  is applied and the pod resolves (PodAdded, 6 s after it began waiting)
  and mounts at once.
* ci/builder-7 (CSI `workspace`): stages, and the publish is still in
  flight when the log ends (an OperationStarted with no outcome).
"""

from __future__ import annotations

import hashlib
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

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

NODE = "node-7"
START_US = 1_714_533_000_000_000  # 2024-05-01T03:10:00Z
ROOT = "/var/lib/kubelet"
DRIVER = "csi.volfsm.example"
CSI = "kubernetes.io/csi"
CSI_LABEL = f"{CSI}:{DRIVER}"
EMPTY_DIR = "kubernetes.io/empty-dir"
GIB = 1024**3

# The reconciler's reasons, as the engine writes them.
REASON_MOUNT = "desired and not mounted"
REASON_REMOUNT_UNCERTAIN = "desired and Uncertain: remount"
REASON_NOT_DESIRED = "no pod wants this pod-volume any more"
REASON_UNSTAGE = "no pod holds or wants the volume"

METRICS_UID = "3f6a1c52-7d0e-4b8a-9c11-5e2d7f4a8b90"
WEB_UID = "8c2e5d71-1a4f-4c3b-b6e2-9d0f3a7c5e18"
REPORT_UID = "b41d9e07-6c2a-4f85-8e3d-2a7b1c9f0d64"
BUILDER_UID = "e9a7c3f1-4b6d-4e2a-a5c8-7f1d0b3e6a25"
CART_UID = "d5b8e2a4-9f1c-4a7e-b3d6-0c2f8e1a7b59"
TSDB_PV = "pvc-2b7e4f10-9c3d-4a6e-8f21-c5d0a9e7b314"
DATA_PV = "pvc-7d1c0e95-3a8f-4b2d-9e64-1f5c8a2b7d03"
INPUT_PV = "pvc-c08f3a6d-5e1b-4c97-a2d4-6b9e0f1c3a58"
WS_PV = "pvc-5a93e2c7-0f4d-4e1a-b8c6-3d7a1f9e2b40"
CART_PV = "pvc-e4c71b2d-8a3f-4d5e-9b06-7f2a1c8d3e65"


class FakeClock:
    """UTC µs, moved forward by the script only."""

    def __init__(self, start_us: int) -> None:
        self.now_us = start_us

    def at(self, seconds: float) -> None:
        """Move to START + `seconds` (never backwards)."""
        target = START_US + round(seconds * 1_000_000)
        if target < self.now_us:
            raise ValueError(f"the script went back in time to +{seconds}s")
        self.now_us = target

    def __call__(self) -> int:
        return self.now_us


def csi_volume(name: str, pv: str, claim: str, size: int, read_only: bool = False) -> DesiredVolume:
    """A PVC-backed CSI volume as the desired state resolves it."""
    return DesiredVolume(
        name=name,
        volume_id=pv,
        pv_name=pv,
        claim_name=claim,
        size_bytes=size,
        read_only=read_only,
        source=VolumeSource(
            plugin=CSI,
            driver=DRIVER,
            volume_handle=f"vol-{pv[4:12]}",
            fs_type="ext4",
            access_modes=("ReadWriteOnce",),
        ),
    )


def empty_dir(pod_uid: str, name: str) -> DesiredVolume:
    """An emptyDir volume of a pod."""
    return DesiredVolume(
        name=name, volume_id=f"emptydir-{pod_uid}-{name}", source=VolumeSource(plugin=EMPTY_DIR)
    )


def staging_path(vol: DesiredVolume) -> str:
    """The CSI staging path kubelet (and volfsm) use for a volume."""
    digest = hashlib.sha256(vol.source.volume_handle.encode()).hexdigest()
    return f"{ROOT}/plugins/{CSI}/{DRIVER}/{digest}/globalmount"


def publish_path(pod_uid: str, vol: DesiredVolume) -> str:
    """The pod's mount path of a volume."""
    if vol.source.plugin == EMPTY_DIR:
        return f"{ROOT}/pods/{pod_uid}/volumes/kubernetes.io~empty-dir/{vol.name}"
    return f"{ROOT}/pods/{pod_uid}/volumes/kubernetes.io~csi/{vol.name}/mount"


class Op:
    """An operation of the script; its id is given when its OperationStarted is written."""

    def __init__(self, stream: str, operation: str) -> None:
        self.stream = stream
        self.operation = operation
        self.op_id = ""


Step = tuple[float, int, Callable[[], None]]


class Incident:
    """The engine's vocabulary, scheduled at times (seconds after START) and run in time order.

    Every method takes the time first and only schedules; `run` writes the
    steps in time order (ties in the order they were scheduled) through the
    command handler, moving the fake clock to each step's time.
    """

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self._ops = 0

    def _at(self, t: float, action: Callable[[], None]) -> None:
        self.steps.append((t, len(self.steps), action))

    def run(self, log: EventLog, clock: FakeClock) -> None:
        handler = CommandHandler(log)
        self.handler = handler
        for t, _, action in sorted(self.steps):
            clock.at(t)
            action()

    # ------------------------------------------------------------ writers

    def _fire(self, stream: str, body: Body) -> None:
        event = type(body).__name__
        table = TABLES[stream_kind(stream)]
        trigger = next(tr.trigger for tr in table.transitions if tr.event == event)
        self.handler.fire(stream, trigger, body)

    def _record(self, stream: str, body: Body) -> None:
        self.handler.record(stream, [body])

    def fire(self, t: float, stream: str, body: Body) -> None:
        self._at(t, lambda: self._fire(stream, body))

    def record(self, t: float, stream: str, body: Body) -> None:
        self._at(t, lambda: self._record(stream, body))

    # --------------------------------------------------------- operations

    def start(
        self,
        t: float,
        stream: str,
        operation: str,
        vol: DesiredVolume,
        pod_uid: str,
        reason: str,
        op_id: str = "",
    ) -> Op:
        """Schedule an OperationStarted; its id is the next of the script's, or `op_id`."""
        op = Op(stream, operation)
        plugin = CSI_LABEL if vol.source.plugin == CSI else EMPTY_DIR

        def write() -> None:
            if op_id:
                op.op_id = op_id
            else:
                self._ops += 1
                op.op_id = f"5e1f09a2-{self._ops}"
            body = OperationStarted(
                op_id=op.op_id,
                operation=operation,
                volume_id=vol.volume_id,
                pod_uid=pod_uid,
                plugin=plugin,
                reason=reason,
            )
            self._record(stream, body)

        self._at(t, write)
        return op

    def succeeded(self, t: float, op: Op, duration_s: float) -> None:
        self._at(
            t,
            lambda: self._record(
                op.stream,
                OperationSucceeded(op_id=op.op_id, operation=op.operation, duration_s=duration_s),
            ),
        )

    def failed(
        self, t: float, op: Op, error: tuple[str, str, bool], backoff_s: float, duration_s: float
    ) -> None:
        code, message, final = error
        self._at(
            t,
            lambda: self._record(
                op.stream,
                OperationFailed(
                    op_id=op.op_id,
                    operation=op.operation,
                    code=code,
                    message=message,
                    final=final,
                    backoff_s=backoff_s,
                    duration_s=duration_s,
                ),
            ),
        )

    # -------------------------------------------------------- desired state

    def add_pod(self, t: float, uid: str, namespace: str, name: str, *vols: DesiredVolume) -> None:
        body = PodAdded(pod_uid=uid, namespace=namespace, name=name, volumes=vols)
        self.record(t, pod_stream(uid), body)

    def pod_pending(
        self, t: float, uid: str, namespace: str, name: str, *waiting: PendingVolume
    ) -> None:
        body = PodPending(pod_uid=uid, namespace=namespace, name=name, waiting=waiting)
        self.record(t, pod_stream(uid), body)

    def object_created(self, t: float, kind: str, namespace: str, name: str, rv: int) -> None:
        digest = hashlib.sha256(f"{kind}/{namespace}/{name}".encode()).hexdigest()
        body = ObjectApplied(
            kind=kind,
            namespace=namespace,
            name=name,
            uid=f"{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-a{digest[17:20]}-{digest[20:32]}",
            resource_version=rv,
            content_hash=f"sha256:{digest}",
        )
        self.record(t, object_stream(kind, namespace, name), body)

    def remove_pod(self, t: float, uid: str, namespace: str, name: str) -> None:
        self.record(t, pod_stream(uid), PodRemoved(pod_uid=uid, namespace=namespace, name=name))

    # ---------------------------------------------------------- transitions

    def attach(self, t: float, vol: DesiredVolume) -> None:
        dev = device_stream(vol.volume_id)
        csi = vol.source.plugin == CSI
        body = DeviceAttached(
            volume_id=vol.volume_id, plugin=CSI_LABEL if csi else EMPTY_DIR, attachable=csi
        )
        self.fire(t, dev, body)
        if csi and vol.size_bytes is not None:
            self.fire(t, dev, VolumeResized(volume_id=vol.volume_id, size_bytes=vol.size_bytes))

    def detach(self, t: float, vol: DesiredVolume) -> None:
        self.fire(t, device_stream(vol.volume_id), DeviceDetached(volume_id=vol.volume_id))

    def staged(self, t: float, vol: DesiredVolume) -> None:
        body = DeviceMounted(
            volume_id=vol.volume_id, device_mount_path=staging_path(vol), mount_found=True
        )
        self.fire(t, device_stream(vol.volume_id), body)

    def device_uncertain(self, t: float, vol: DesiredVolume, reason: str) -> None:
        body = DeviceMountUncertain(
            volume_id=vol.volume_id, reason=reason, device_mount_path=staging_path(vol)
        )
        self.fire(t, device_stream(vol.volume_id), body)

    def unstaged(self, t: float, vol: DesiredVolume) -> None:
        body = DeviceUnmounted(volume_id=vol.volume_id, reason="unstaged")
        self.fire(t, device_stream(vol.volume_id), body)

    def mounted(self, t: float, uid: str, vol: DesiredVolume) -> None:
        body = VolumeMounted(
            volume_id=vol.volume_id,
            pod_uid=uid,
            volume_name=vol.name,
            mount_path=publish_path(uid, vol),
            mount_found=True,
        )
        self.fire(t, podvol_stream(uid, vol.name), body)

    def podvol_uncertain(self, t: float, uid: str, vol: DesiredVolume, reason: str) -> None:
        body = VolumeMountUncertain(
            volume_id=vol.volume_id, pod_uid=uid, volume_name=vol.name, reason=reason
        )
        self.fire(t, podvol_stream(uid, vol.name), body)

    def unmounted(self, t: float, uid: str, vol: DesiredVolume, reason: str) -> None:
        body = VolumeUnmounted(
            volume_id=vol.volume_id, pod_uid=uid, volume_name=vol.name, reason=reason
        )
        self.fire(t, podvol_stream(uid, vol.name), body)


STAGE_TIMEOUT = ("DeadlineExceeded", "MountDevice did not finish within 15 s", False)
PUBLISH_TIMEOUT = ("DeadlineExceeded", "SetUp did not finish within 15 s", False)
DRIVER_DOWN = (
    "Unavailable",
    "rpc error: code = Unavailable desc = connection error: dial unix "
    "/var/lib/kubelet/plugins/csi.volfsm.example/csi.sock: connect: connection refused",
    False,
)
BUSY = ("Internal", "rpc error: code = Internal desc = umount: target is busy", False)
IN_USE = (
    "FailedPrecondition",
    "rpc error: code = FailedPrecondition desc = staging path is still in use by process 4127",
    True,
)
BAD_OPTION = (
    "InvalidArgument",
    'rpc error: code = InvalidArgument desc = mount option "data=journal" is not supported',
    True,
)


def _stage_uncertain_reason(error: tuple[str, str, bool]) -> str:
    return f"stage may be in progress ({error[0]}: {error[1]})"


def _publish_uncertain_reason(error: tuple[str, str, bool]) -> str:
    return f"publish may be in progress ({error[0]}: {error[1]})"


def metrics_pod(s: Incident, tsdb: DesiredVolume) -> None:
    """monitoring/metrics-0: mounted at the start, expanded online later."""
    pv = podvol_stream(METRICS_UID, "tsdb")
    s.add_pod(0.0, METRICS_UID, "monitoring", "metrics-0", tsdb)
    op = s.start(0.05, pv, "volume_mount", tsdb, METRICS_UID, REASON_MOUNT)
    s.attach(0.06, tsdb)
    s.staged(1.86, tsdb)
    s.mounted(2.30, METRICS_UID, tsdb)
    s.succeeded(2.302, op, 2.252)
    dev = device_stream(tsdb.volume_id)
    s.record(
        90.0, pod_stream(METRICS_UID), DesiredSizeChanged(volume_id=TSDB_PV, size_bytes=8 * GIB)
    )
    reason = f"pods want {8 * GIB} bytes, the volume has {5 * GIB}"
    op = s.start(90.1, dev, "volume_fs_resize", tsdb, METRICS_UID, reason)
    s.fire(91.6, dev, VolumeResized(volume_id=TSDB_PV, size_bytes=8 * GIB))
    s.succeeded(91.601, op, 1.501)


def web_pod(s: Incident, data: DesiredVolume, cache: DesiredVolume) -> None:
    """shop/web-0: NodeStage times out and is retried; deleted while Uncertain; torn down."""
    pv = podvol_stream(WEB_UID, "data")
    cache_pv = podvol_stream(WEB_UID, "cache")
    dev = device_stream(data.volume_id)
    s.add_pod(10.0, WEB_UID, "shop", "web-0", data, cache)
    op = s.start(10.05, cache_pv, "volume_mount", cache, WEB_UID, REASON_MOUNT)
    s.attach(10.051, cache)
    s.mounted(10.09, WEB_UID, cache)
    s.succeeded(10.091, op, 0.041)
    # data: attach, then NodeStage times out twice and fails once more, backoff 0.5 s, 1 s, 2 s.
    op = s.start(10.052, pv, "volume_mount", data, WEB_UID, REASON_MOUNT)
    s.attach(10.06, data)
    s.device_uncertain(25.062, data, _stage_uncertain_reason(STAGE_TIMEOUT))
    s.failed(25.063, op, STAGE_TIMEOUT, 0.5, 15.011)
    op = s.start(25.6, pv, "volume_mount", data, WEB_UID, REASON_MOUNT)
    s.failed(40.61, op, STAGE_TIMEOUT, 1.0, 15.01)
    op = s.start(41.7, pv, "volume_mount", data, WEB_UID, REASON_MOUNT)
    s.failed(41.93, op, DRIVER_DOWN, 2.0, 0.23)
    # Fourth attempt: staged, but the publish times out: the pod volume is Uncertain.
    op = s.start(44.0, pv, "volume_mount", data, WEB_UID, REASON_MOUNT)
    s.staged(46.4, data)
    s.podvol_uncertain(61.41, WEB_UID, data, _publish_uncertain_reason(PUBLISH_TIMEOUT))
    s.failed(61.412, op, PUBLISH_TIMEOUT, 4.0, 17.412)
    # Deleted while data is Uncertain: the unpublish still runs.
    s.remove_pod(63.0, WEB_UID, "shop", "web-0")
    op = s.start(63.1, cache_pv, "volume_unmount", cache, WEB_UID, REASON_NOT_DESIRED)
    s.unmounted(63.15, WEB_UID, cache, "unpublished")
    s.succeeded(63.151, op, 0.051)
    s.detach(63.3, cache)
    op = s.start(63.2, pv, "volume_unmount", data, WEB_UID, REASON_NOT_DESIRED)
    s.failed(63.5, op, BUSY, 0.5, 0.3)
    op = s.start(64.1, pv, "volume_unmount", data, WEB_UID, REASON_NOT_DESIRED)
    s.failed(64.35, op, BUSY, 1.0, 0.25)
    op = s.start(65.4, pv, "volume_unmount", data, WEB_UID, REASON_NOT_DESIRED)
    s.unmounted(65.65, WEB_UID, data, "unpublished")
    s.succeeded(65.651, op, 0.251)
    op = s.start(65.8, dev, "unmount_device", data, "", REASON_UNSTAGE)
    s.device_uncertain(67.0, data, f"unstage failed ({IN_USE[0]}: {IN_USE[1]})")
    s.failed(67.001, op, IN_USE, 0.5, 1.201)
    op = s.start(67.6, dev, "unmount_device", data, "", REASON_UNSTAGE)
    s.unstaged(68.7, data)
    s.succeeded(68.701, op, 1.101)
    s.detach(68.9, data)


def report_pod(s: Incident, vol: DesiredVolume) -> None:
    """batch/report-1: a publish timeout, then final errors with a doubling backoff."""
    pv = podvol_stream(REPORT_UID, "input")
    s.add_pod(30.0, REPORT_UID, "batch", "report-1", vol)
    op = s.start(30.1, pv, "volume_mount", vol, REPORT_UID, REASON_MOUNT)
    s.attach(30.11, vol)
    s.staged(31.4, vol)
    s.podvol_uncertain(46.41, REPORT_UID, vol, _publish_uncertain_reason(PUBLISH_TIMEOUT))
    s.failed(46.412, op, PUBLISH_TIMEOUT, 0.5, 16.312)
    op = s.start(47.0, pv, "volume_mount", vol, REPORT_UID, REASON_REMOUNT_UNCERTAIN)
    reason = f"publish failed with a final error ({BAD_OPTION[0]}) while Uncertain"
    s.unmounted(47.3, REPORT_UID, vol, reason)
    s.failed(47.301, op, BAD_OPTION, 1.0, 0.301)
    start, backoff = 48.4, 2.0
    while backoff <= 64.0:
        op = s.start(start, pv, "volume_mount", vol, REPORT_UID, REASON_MOUNT)
        s.failed(round(start + 0.2, 3), op, BAD_OPTION, backoff, 0.2)
        start = round(start + 0.2 + backoff + 0.1, 3)
        backoff *= 2


def cart_pod(s: Incident, vol: DesiredVolume) -> None:
    """shop/cart-0: waits for its claim, then for the claim's PV; resolved, then mounted."""
    claim = f"PersistentVolumeClaim shop/{vol.claim_name}"
    no_claim = PendingVolume(name=vol.name, waits_for=claim, reason="not found yet")
    s.pod_pending(92.0, CART_UID, "shop", "cart-0", no_claim)
    s.object_created(95.0, "PersistentVolumeClaim", "shop", vol.claim_name, 3)
    no_pv = PendingVolume(
        name=vol.name,
        waits_for=f"PersistentVolume {vol.pv_name}",
        reason=f"not found yet ({claim} is bound to it)",
        needs=(claim,),
    )
    s.pod_pending(95.0, CART_UID, "shop", "cart-0", no_pv)
    s.object_created(98.0, "PersistentVolume", "", vol.pv_name, 4)
    s.add_pod(98.0, CART_UID, "shop", "cart-0", vol)
    stream = podvol_stream(CART_UID, vol.name)
    op = s.start(98.05, stream, "volume_mount", vol, CART_UID, REASON_MOUNT, op_id="7c3a9d10-1")
    s.attach(98.06, vol)
    s.staged(99.6, vol)
    s.mounted(100.1, CART_UID, vol)
    s.succeeded(100.102, op, 2.052)


def builder_pod(s: Incident, ws: DesiredVolume) -> None:
    """ci/builder-7: staged; the publish is in flight when the log ends."""
    pv = podvol_stream(BUILDER_UID, "workspace")
    s.add_pod(108.0, BUILDER_UID, "ci", "builder-7", ws)
    s.start(108.1, pv, "volume_mount", ws, BUILDER_UID, REASON_MOUNT)
    s.attach(108.11, ws)
    s.staged(110.3, ws)


def scenario() -> Incident:
    """Every step of the incident, scheduled (nothing written yet)."""
    s = Incident()
    metrics_pod(s, csi_volume("tsdb", TSDB_PV, "metrics-tsdb", 5 * GIB))
    web_pod(s, csi_volume("data", DATA_PV, "web-data", 10 * GIB), empty_dir(WEB_UID, "cache"))
    report_pod(s, csi_volume("input", INPUT_PV, "report-input", GIB, read_only=True))
    cart_pod(s, csi_volume("data", CART_PV, "cart-data", 2 * GIB))
    builder_pod(s, csi_volume("workspace", WS_PV, "builder-ws", 50 * GIB))
    return s


def write_incident(path: Path) -> int:
    """Write the incident log to `path` (replacing it); the number of events written."""
    for suffix in ("", "-wal", "-shm", ".lock"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    clock = FakeClock(START_US)
    log = EventLog(path, node=NODE, clock=clock)
    try:
        scenario().run(log, clock)
        events = log.last_seq()
    finally:
        log.close()
    path.with_name(path.name + ".lock").unlink(missing_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("VACUUM")
    finally:
        conn.close()
    return events


def main() -> None:
    """`python tests/data/make_incident.py [OUT]`."""
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("incident.db")
    events = write_incident(out)
    print(f"wrote {events} events to {out}")


if __name__ == "__main__":
    main()
