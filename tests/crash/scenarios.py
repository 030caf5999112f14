"""The crash matrix: which fault points each volume kind meets on its mount and unmount path.

A `Case` crashes one node twice, once on the mount path and once on the
unmount path, and then checks that it converges (`run_case`):

1. mount: start armed with `mount`; apply three pods (each with its own
   volumes of the kind); the service kills itself at the point. The pod
   whose operation died (named in the kill line; else the first) is then
   deleted while the service is down: the restart must find and clean what
   the interrupted mount left, not only finish it. For a killed CSI call
   the driver fails the restarted service's retry of it once with a final
   error (`retry_fails`), so that the retry cannot paper over what the
   engine believes.
2. unmount: start armed with `unmount`; the service learns the desired
   state again and must clean up that pod and finish mounting the others;
   if the point did not fire during that, the second pod is deleted, which
   must reach it.
3. start without a fault: everything converges (the third pod Mounted and
   never unmounted, the others gone without a trace, log valid, stream ==
   log), and the service drains cleanly.

For `driver.during` on a CSI call the driver is told to hold that RPC for
a while (after doing the work on the mount path: the reply is what gets
lost; before doing it on the unmount path: the driver finishes its work
while the service restarts), so the kill lands while the driver has the
request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

from tests.crash.harness import Crash, CrashNode, CrashTestError

DURING_HOLD_S = 1.0
"""How long the driver holds an RPC a `driver.during` case kills the service in."""
DURING_KILL_S = 0.3
"""How far into such an RPC the service kills itself."""

RPC_OF_CALL = {
    "mount_device": "NodeStageVolume",
    "set_up_device": "NodeStageVolume",
    "set_up": "NodePublishVolume",
    "map_pod_device": "NodePublishVolume",
    "tear_down": "NodeUnpublishVolume",
    "unmap_pod_device": "NodeUnpublishVolume",
    "unmount_device": "NodeUnstageVolume",
    "tear_down_device": "NodeUnstageVolume",
}
"""The CSI RPC behind each plugin call of volfsm's CSI plugin."""

POD_KINDS = {
    "fs": ["fs"],
    "block": ["block"],
    "emptydir": ["emptydir", "tmpfs"],
    "objects": ["configmap", "secret"],
}
"""The volumes each pod of a case has."""


def _driver(calls: list[str]) -> list[str]:
    during = [f"driver.during/{c}+{DURING_KILL_S}" for c in calls]
    return [f"driver.{when}/{c}" for c in calls for when in ("before", "after")] + during


PATHS: dict[str, tuple[list[str], list[str]]] = {
    "fs": (
        [
            *_driver(["mount_device", "set_up"]),
            "append.after/volume_mount/OperationStarted",
            "append.after/volume_mount/DeviceMounted",
            "append.after/volume_mount/VolumeMounted",
            "append.after/volume_mount/OperationSucceeded",
            "relay.before_publish/VolumeMounted",
            "relay.before_cursor@2",
        ],
        [
            *_driver(["tear_down", "unmount_device"]),
            "append.after/volume_unmount/VolumeUnmounted",
            "append.after/volume_unmount/OperationSucceeded",
            "append.after/unmount_device/DeviceUnmounted",
            "append.after/unmount_device/OperationSucceeded",
            "append.after/mark_detached/DeviceDetached",
            "relay.before_publish/DeviceUnmounted",
            "relay.before_cursor@2",
        ],
    ),
    "block": (
        [
            *_driver(["set_up_device", "map_pod_device"]),
            "append.after/map_volume/OperationStarted",
            "append.after/map_volume/DeviceMounted",
            "append.after/map_volume/VolumeMounted",
            "relay.before_publish/VolumeMounted@2",
        ],
        [
            *_driver(["unmap_pod_device", "tear_down_device"]),
            "append.after/unmap_volume/VolumeUnmounted",
            "append.after/unmap_volume/OperationSucceeded",
            "append.after/unmap_device/DeviceUnmounted",
            "append.after/mark_detached/DeviceDetached",
            "relay.before_publish/VolumeUnmounted",
        ],
    ),
    "emptydir": (
        [
            "driver.before/set_up",
            "driver.during/set_up+0",
            "driver.after/set_up@2",
            "append.after/volume_mount/OperationStarted@3",
            "append.after/volume_mount/DeviceAttached",
            "append.after/volume_mount/VolumeMounted@2",
            "append.after/volume_mount/OperationSucceeded",
            "relay.before_publish/VolumeMounted",
            "relay.before_cursor@3",
        ],
        [
            "driver.before/tear_down",
            "driver.during/tear_down+0",
            "driver.after/tear_down@2",
            "append.after/volume_unmount/OperationStarted",
            "append.after/volume_unmount/VolumeUnmounted",
            "append.after/volume_unmount/OperationSucceeded",
            "append.after/mark_detached/DeviceDetached",
            "relay.before_publish/VolumeUnmounted",
            "relay.before_cursor@2",
        ],
    ),
    "objects": (
        [
            "driver.before/set_up",
            "driver.during/set_up+0",  # killed as SetUp returns: the swap done, not recorded
            "driver.after/set_up@2",
            "append.after/volume_mount/VolumeMounted@2",
        ],
        [
            "driver.before/tear_down",
            "driver.during/tear_down+0",
            "driver.after/tear_down@2",
            "append.after/volume_unmount/VolumeUnmounted",
        ],
    ),
}
"""Per kind: (mount-path specs, unmount-path specs)."""


@dataclass(frozen=True)
class Case:
    """One node, crashed once on the mount path and once on the unmount path."""

    kind: str
    mount: str
    unmount: str

    @property
    def id(self) -> str:
        """The pytest id."""
        return f"{self.kind}:{self.mount}|{self.unmount}"


def matrix() -> list[Case]:
    """Every mount-path and every unmount-path spec of every kind, paired up."""
    cases = []
    for kind, (mount, unmount) in PATHS.items():
        for i, (m, u) in enumerate(zip_longest(mount, unmount)):
            cases.append(Case(kind, m or mount[i % len(mount)], u or unmount[i % len(unmount)]))
    return cases


def driver_rules(spec: str, *, after_work: bool) -> list[dict[str, Any]]:
    """CSI driver fault rules that hold the RPC a `driver.during` spec kills the service in."""
    if not spec.startswith("driver.during/"):
        return []
    call = spec.split("/")[1].split("+")[0].split("@")[0]
    rpc = RPC_OF_CALL.get(call)
    if rpc is None:
        return []
    return [
        {
            "rpc": rpc,
            "action": "delay",
            "seconds": DURING_HOLD_S,
            "when": "after" if after_work else "before",
            "times": 1,
        }
    ]


def retry_fails(crash: Crash) -> list[dict[str, Any]]:
    """A driver rule failing the restarted service's retry of the killed CSI call, once, finally.

    After the restart the engine retries the interrupted mount at once (the
    pod is still desired in its log). If that retry fails with a final error
    (here FAILED_PRECONDITION) and the pod is then deleted, only knowing that
    the killed call may have done its work (the open OperationStarted makes
    the entry Uncertain) gets the staging or publish mount cleaned up; an
    engine that trusted "not mounted" would leak it.
    """
    hit = re.match(r"volfsm: fault point driver\.\w+ (\S+)", crash.line)
    volume = re.search(r"volume=\S*\^(\S+)\]", crash.line)
    if hit is None or volume is None:
        return []
    call = re.sub(r"(?<!^)(?=[A-Z])", "_", hit[1].split("/")[-1]).lower()  # SetUp -> set_up
    rpc = RPC_OF_CALL.get(call)
    if rpc is None:
        return []
    return [
        {
            "rpc": rpc,
            "volume_id": volume[1],
            "action": "error",
            "code": "FAILED_PRECONDITION",
            "message": "injected: the retry after the crash fails for good",
            "times": 1,
        }
    ]


def run_case(node: CrashNode, case: Case) -> None:
    """Crash on the mount path, then on the unmount path, then converge (module docstring)."""
    kinds = POD_KINDS[case.kind]
    pods = [node.new_pod(name, kinds) for name in ("p1", "p2", "p3")]

    node.driver.set_faults(driver_rules(case.mount, after_work=True))
    if not node.start(case.mount):
        raise CrashTestError(f"{case.mount} fired before the service was ready")
    node.apply(*pods)
    crash = node.wait_crash()
    if crash is None:
        raise CrashTestError(f"mount path: {case.mount} was never reached\n{node.diagnostics()}")
    gone = next((p for p in pods if p.uid == crash.pod), pods[0])
    node.forget(gone.uid)  # the pod whose mount died, deleted while the service is down
    victim, keeper = (p for p in pods if p is not gone)

    node.driver.set_faults(retry_fails(crash) + driver_rules(case.unmount, after_work=False))
    crashed = not node.start(case.unmount) or not node.resync() or not node.settle()
    if not crashed:
        node.delete(victim.uid)
        crashed = node.wait_crash() is not None
    if not crashed:
        raise CrashTestError(
            f"unmount path: {case.unmount} was never reached\n{node.diagnostics()}"
        )

    node.driver.clear_faults()
    if victim.uid in node.desired:
        node.forget(victim.uid)
    assert node.start(), node.diagnostics()
    assert node.resync(), node.diagnostics()
    node.converge()
    assert list(node.desired) == [keeper.uid]
    code = node.stop()
    if code != 0:
        raise CrashTestError(
            f"the converged service drained with exit {code}\n{node.diagnostics()}"
        )
