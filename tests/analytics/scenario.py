"""A small fixed two-node history whose report figures are worked out by hand in the tests.

Times are seconds after T0. Driver E = ebs.csi.aws.com, N = nfs.csi.k8s.io.

n1: pod p1 (data: E^v1, cache: N^n1) and pod p2 (data: E^v2).
  t1-t3   o1 volume_mount E^v1, staged t1->t2 (stage 1.0), ok 2.0
  t3-t8   o2 volume_mount N^n1 fails DeadlineExceeded (non-final, 5.0); p1/cache Uncertain t8
  t9-t10  o3 volume_mount N^n1 ok 1.0; p1/cache Mounted t10 (Uncertain 2.0); p1 ready 10.0
  t21-t25 o4 volume_mount E^v2, staged t21->t23 (stage 2.0), ok 4.0; p2 ready 5.0
  t30     o5 volume_unmount E^v1 ok 0.5
  t31-t32 o6 unmount_device E^v1 fails Internal (non-final); device Uncertain from t32, open
  t40-t41 o7 unmount_device E^v1 fails Internal (non-final) again
n2: pod q1 (data: E^w1), pod q2 (data: E^w2).
  t0-t3   r1 volume_mount E^w1, staged t0->t1 (stage 1.0), ok 3.0; q1 ready 3.0
  t5-t6   r2 volume_mount E^w2 fails DeadlineExceeded (non-final, 1.0); device Uncertain t6
  t7-t8   r3 volume_mount E^w2 fails InvalidArgument (final, 1.0); device Unmounted t8 (2.0)
  t9-t19  r4 volume_mount E^w2, staged t9->t9.5 (stage 0.5), ok 10.0; q2 ready 14.0
  t50     r5 volume_fs_resize E^w1 ok 0.25
  t60     restart: E^w1 device and q1/data reconstructed Uncertain; both Mounted again at t61
"""

from __future__ import annotations

from events.streams import device_stream, pod_stream, podvol_stream
from events.types import (
    DeviceAttached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    Envelope,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeResized,
    VolumeUnmounted,
)
from tests.analytics.sim import T0, SimNode, csi_plugin, csi_vid, desired

E = "ebs.csi.aws.com"
N = "nfs.csi.k8s.io"
NOW_US = T0 + 100_000_000
"""The report time: T0 + 100 s."""


def _started(op: str, operation: str, vid: str, uid: str, driver: str) -> OperationStarted:
    return OperationStarted(
        op_id=op, operation=operation, volume_id=vid, pod_uid=uid, plugin=csi_plugin(driver)
    )


def _ok(op: str, operation: str, duration: float) -> OperationSucceeded:
    return OperationSucceeded(op_id=op, operation=operation, duration_s=duration)


def _failed(op: str, operation: str, code: str, final: bool, duration: float) -> OperationFailed:
    return OperationFailed(
        op_id=op, operation=operation, code=code, message="x", final=final, duration_s=duration
    )


def node1() -> list[Envelope]:
    """Node n1's history (26 events, the last at t41)."""
    n = SimNode("n1")
    v1, nn, v2 = csi_vid(E, "v1"), csi_vid(N, "n1"), csi_vid(E, "v2")
    data, cache = podvol_stream("p1", "data"), podvol_stream("p1", "cache")
    n.at(
        0,
        pod_stream("p1"),
        PodAdded(
            pod_uid="p1",
            namespace="ns",
            name="p1",
            volumes=(desired("data", E, "v1"), desired("cache", N, "n1")),
        ),
    )
    n.at(1, data, _started("o1", "volume_mount", v1, "p1", E))
    n.at(1, device_stream(v1), DeviceAttached(volume_id=v1, plugin=csi_plugin(E)))
    n.at(2, device_stream(v1), DeviceMounted(volume_id=v1))
    n.at(3, data, VolumeMounted(volume_id=v1, pod_uid="p1", volume_name="data"))
    n.at(3, data, _ok("o1", "volume_mount", 2.0))
    n.at(3, cache, _started("o2", "volume_mount", nn, "p1", N))
    n.at(8, cache, _failed("o2", "volume_mount", "DeadlineExceeded", False, 5.0))
    n.at(
        8,
        cache,
        VolumeMountUncertain(volume_id=nn, pod_uid="p1", volume_name="cache", reason="timeout"),
    )
    n.at(9, cache, _started("o3", "volume_mount", nn, "p1", N))
    n.at(10, cache, VolumeMounted(volume_id=nn, pod_uid="p1", volume_name="cache"))
    n.at(10, cache, _ok("o3", "volume_mount", 1.0))
    p2 = podvol_stream("p2", "data")
    n.at(
        20,
        pod_stream("p2"),
        PodAdded(pod_uid="p2", namespace="ns", name="p2", volumes=(desired("data", E, "v2"),)),
    )
    n.at(21, p2, _started("o4", "volume_mount", v2, "p2", E))
    n.at(21, device_stream(v2), DeviceAttached(volume_id=v2, plugin=csi_plugin(E)))
    n.at(23, device_stream(v2), DeviceMounted(volume_id=v2))
    n.at(25, p2, VolumeMounted(volume_id=v2, pod_uid="p2", volume_name="data"))
    n.at(25, p2, _ok("o4", "volume_mount", 4.0))
    n.at(30, data, _started("o5", "volume_unmount", v1, "p1", E))
    n.at(30.5, data, VolumeUnmounted(volume_id=v1, pod_uid="p1", volume_name="data"))
    n.at(30.5, data, _ok("o5", "volume_unmount", 0.5))
    dev = device_stream(v1)
    n.at(31, dev, _started("o6", "unmount_device", v1, "", E))
    n.at(32, dev, _failed("o6", "unmount_device", "Internal", False, 1.0))
    n.at(32, dev, DeviceMountUncertain(volume_id=v1, reason="unstage failed"))
    n.at(40, dev, _started("o7", "unmount_device", v1, "", E))
    n.at(41, dev, _failed("o7", "unmount_device", "Internal", False, 1.0))
    return n.envs


def node2() -> list[Envelope]:
    """Node n2's history (25 events, the last at t61)."""
    n = SimNode("n2")
    w1, w2 = csi_vid(E, "w1"), csi_vid(E, "w2")
    q1, q2 = podvol_stream("q1", "data"), podvol_stream("q2", "data")
    n.at(
        0,
        pod_stream("q1"),
        PodAdded(pod_uid="q1", namespace="ns", name="q1", volumes=(desired("data", E, "w1"),)),
    )
    n.at(0, q1, _started("r1", "volume_mount", w1, "q1", E))
    n.at(0, device_stream(w1), DeviceAttached(volume_id=w1, plugin=csi_plugin(E)))
    n.at(1, device_stream(w1), DeviceMounted(volume_id=w1))
    n.at(3, q1, VolumeMounted(volume_id=w1, pod_uid="q1", volume_name="data"))
    n.at(3, q1, _ok("r1", "volume_mount", 3.0))
    n.at(
        5,
        pod_stream("q2"),
        PodAdded(pod_uid="q2", namespace="ns", name="q2", volumes=(desired("data", E, "w2"),)),
    )
    n.at(5, q2, _started("r2", "volume_mount", w2, "q2", E))
    n.at(5, device_stream(w2), DeviceAttached(volume_id=w2, plugin=csi_plugin(E)))
    n.at(6, device_stream(w2), DeviceMountUncertain(volume_id=w2, reason="stage timed out"))
    n.at(6, q2, _failed("r2", "volume_mount", "DeadlineExceeded", False, 1.0))
    n.at(7, q2, _started("r3", "volume_mount", w2, "q2", E))
    n.at(8, q2, _failed("r3", "volume_mount", "InvalidArgument", True, 1.0))
    n.at(8, device_stream(w2), DeviceUnmounted(volume_id=w2, reason="final error"))
    n.at(9, q2, _started("r4", "volume_mount", w2, "q2", E))
    n.at(9.5, device_stream(w2), DeviceMounted(volume_id=w2))
    n.at(19, q2, VolumeMounted(volume_id=w2, pod_uid="q2", volume_name="data"))
    n.at(19, q2, _ok("r4", "volume_mount", 10.0))
    dev = device_stream(w1)
    n.at(50, dev, _started("r5", "volume_fs_resize", w1, "q1", E))
    n.at(50.25, dev, VolumeResized(volume_id=w1, size_bytes=2 << 30))
    n.at(50.25, dev, _ok("r5", "volume_fs_resize", 0.25))
    n.at(60, dev, DeviceMountUncertain(volume_id=w1, reason="reconstructed", reconstructed=True))
    n.at(
        60,
        q1,
        VolumeMountUncertain(
            volume_id=w1,
            pod_uid="q1",
            volume_name="data",
            reason="reconstructed",
            reconstructed=True,
        ),
    )
    n.at(61, dev, DeviceMounted(volume_id=w1))
    n.at(61, q1, VolumeMounted(volume_id=w1, pod_uid="q1", volume_name="data"))
    return n.envs
