"""Objects, paths, log queries, waits and "what is left" checks for the engine-level CSI tests."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from events.log import EventLog
from events.streams import device_stream, podvol_stream
from events.tables import DETACHED
from events.types import (
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
)
from tests.helpers.csidriver import DriverProcess, loop_devices, loops_of, mountinfo
from volfsm.desired.resolve import csi_volume_id
from volfsm.engine import VolumeEngine
from volfsm.node.layout import RootLayout

DRIVER = "csi.volfsm.dev"
NODE = "node-1"
MIB = 1 << 20

# ------------------------------------------------------------------ objects


def pv(
    name: str,
    handle: str,
    *,
    size: str = "32Mi",
    mode: str = "Filesystem",
    driver: str = DRIVER,
    access: str = "ReadWriteOnce",
) -> dict[str, Any]:
    """A CSI PersistentVolume of `driver` for an existing volume `handle`."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "csi": {"driver": driver, "volumeHandle": handle, "fsType": "ext4"},
            "capacity": {"storage": size},
            "volumeMode": mode,
            "accessModes": [access],
        },
    }


def pvc(name: str, volume: str, *, mode: str = "Filesystem") -> dict[str, Any]:
    """A claim in namespace default bound to PersistentVolume `volume`."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"volumeName": volume, "volumeMode": mode},
        "status": {"phase": "Bound"},
    }


def pod(uid: str, claim: str, volume: str = "data") -> dict[str, Any]:
    """A pod with one volume `volume` backed by `claim`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{uid}", "namespace": "default", "uid": uid},
        "spec": {"volumes": [{"name": volume, "persistentVolumeClaim": {"claimName": claim}}]},
    }


def claimed_volume(
    name: str, handle: str, *, size: str = "32Mi", mode: str = "Filesystem", driver: str = DRIVER
) -> list[dict[str, Any]]:
    """A PV `name` for `handle` and a claim `name` bound to it."""
    return [pv(name, handle, size=size, mode=mode, driver=driver), pvc(name, name, mode=mode)]


def volume_id(handle: str, driver: str = DRIVER) -> str:
    """The engine's volume id of a CSI volume handle."""
    return csi_volume_id(driver, handle)


# ------------------------------------------------------------------ log


T = TypeVar("T")


@dataclass(frozen=True)
class Recorded(Generic[T]):
    """An event body with the time the log recorded it (UTC µs)."""

    ts: int
    body: T


def records(log: EventLog, kind: type[T], stream: str | None = None) -> list[Recorded[T]]:
    """Events of one type (of one stream) with their times, in log order."""
    envs = log.read_after(0) if stream is None else log.read_stream(stream)
    return [Recorded(env.ts, env.body) for env in envs if isinstance(env.body, kind)]


def bodies(log: EventLog, kind: type[T], stream: str | None = None) -> list[T]:
    """Event bodies of one type (of one stream), in log order."""
    return [r.body for r in records(log, kind, stream)]


def started(log: EventLog, operation: str, stream: str | None = None) -> list[OperationStarted]:
    """Every OperationStarted of `operation` (on one stream)."""
    return [b for b in bodies(log, OperationStarted, stream) if b.operation == operation]


def attempts(
    log: EventLog, operation: str, stream: str | None = None
) -> list[Recorded[OperationStarted]]:
    """Every OperationStarted of `operation` (on one stream), with its time."""
    return [r for r in records(log, OperationStarted, stream) if r.body.operation == operation]


def failed(
    log: EventLog, operation: str, stream: str | None = None
) -> list[Recorded[OperationFailed]]:
    """Every OperationFailed of `operation` (on one stream), with its time."""
    return [r for r in records(log, OperationFailed, stream) if r.body.operation == operation]


def succeeded(log: EventLog, operation: str, stream: str | None = None) -> list[OperationSucceeded]:
    """Every OperationSucceeded of `operation` (on one stream)."""
    return [b for b in bodies(log, OperationSucceeded, stream) if b.operation == operation]


def transitions(log: EventLog, stream: str) -> list[str]:
    """The FSM events of one stream (operation records left out)."""
    return [env.type for env in log.read_stream(stream) if not env.type.startswith("Operation")]


def device_events(log: EventLog, handle: str) -> list[str]:
    """The device FSM's events of a volume."""
    return transitions(log, device_stream(volume_id(handle)))


def podvol_events(log: EventLog, uid: str, name: str = "data") -> list[str]:
    """The pod-volume FSM's events of one pod's volume."""
    return transitions(log, podvol_stream(uid, name))


# ------------------------------------------------------------------ waits


async def eventually(
    predicate: Callable[[], bool], what: str, timeout: float = 60.0, interval: float = 0.02
) -> None:
    """Poll `predicate` until it holds; fail after `timeout` seconds (an upper bound only)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


def device_state(engine: VolumeEngine, handle: str) -> str:
    """The live device state of a volume ("Detached" without a record)."""
    dev = engine.asw.devices.get(volume_id(handle))
    return dev.state if dev is not None else DETACHED


def podvol_state(engine: VolumeEngine, uid: str, name: str = "data") -> str:
    """The live pod-volume state ("Unmounted" without a record)."""
    pv_ = engine.asw.podvols.get((uid, name))
    return pv_.state if pv_ is not None else "Unmounted"


async def delete_and_wait(
    engine: VolumeEngine, uids: Iterable[str], handles: Iterable[str], timeout: float = 60.0
) -> None:
    """Delete pods, then `wait_gone`."""
    uids = list(uids)
    for uid in uids:
        assert await engine.delete_pod(uid=uid)
    await wait_gone(engine, uids, handles, timeout)


async def wait_gone(
    engine: VolumeEngine, uids: Iterable[str], handles: Iterable[str], timeout: float = 60.0
) -> None:
    """Wait until deleted pods are unmounted, their volumes detached, their dirs removed."""
    uids, handles = list(uids), list(handles)
    for uid in uids:
        await engine.wait_pod(uid, "unmounted", timeout=timeout)
    await eventually(
        lambda: all(device_state(engine, h) == DETACHED for h in handles),
        f"volumes {handles} detached",
        timeout,
    )
    await eventually(
        lambda: not any(engine.layout.pod_dir(uid).exists() for uid in uids),
        f"pod dirs of {uids} removed",
        timeout,
    )
    await engine.settle(timeout=timeout)


# ------------------------------------------------------------------ node state


def mounts_under(path: Path) -> list[str]:
    """Mount points at or under `path`."""
    base = os.path.realpath(path)
    return [
        m.mount_point
        for m in mountinfo()
        if m.mount_point == base or m.mount_point.startswith(base + "/")
    ]


def loops_backed_under(path: Path) -> list[tuple[str, str]]:
    """(loop device, backing file) of loop devices backed by a file under `path`."""
    base = os.path.realpath(path) + "/"
    return [(dev, back) for dev, back in loop_devices() if back.startswith(base)]


def rdev(path: str | Path) -> int:
    """The device number of a block device node (following links)."""
    st = os.stat(path)
    assert stat.S_ISBLK(st.st_mode), f"{path} is not a block device"
    return st.st_rdev


def only_loop(drv: DriverProcess, handle: str) -> str:
    """The one loop device the driver attached for `handle` (fails if there are 0 or 2+)."""
    loops = loops_of(drv.image(handle))
    assert len(loops) == 1, f"loop devices of {handle}: {loops}"
    return loops[0]


SHARED_DIRS = (
    "plugins",
    "plugins/kubernetes.io",
    "plugins/kubernetes.io/csi",
    f"plugins/kubernetes.io/csi/{DRIVER}",
    "plugins/kubernetes.io/csi/volumeDevices",
    "plugins/kubernetes.io/csi/volumeDevices/staging",
    "plugins/kubernetes.io/csi/volumeDevices/publish",
    "pods",
)
"""Directories under the root shared by every volume: they stay (kubelet leaves them too)."""


def root_leftovers(layout: RootLayout) -> list[str]:
    """Everything under the root but the shared directories: files (vol_data.json), links,
    per-volume and per-pod directories."""
    found = []
    for dirpath, dirnames, filenames in os.walk(layout.root):
        rel_dir = Path(dirpath).relative_to(layout.root)
        found += [str(rel_dir / name) for name in filenames]
        for name in dirnames:
            rel = str(rel_dir / name)
            if os.path.islink(Path(dirpath) / name) or rel not in SHARED_DIRS:
                found.append(f"{rel}/")
    return sorted(found)


def assert_nothing_left(
    drv: DriverProcess | None, layout: RootLayout, handles: Iterable[str]
) -> None:
    """No mount under the root, no loop device of the volumes' files or backed under the
    root, no per-volume or per-pod directory, no vol_data.json; the driver holds nothing."""
    root = layout.root
    assert mounts_under(root) == []
    assert loops_backed_under(root) == []
    assert root_leftovers(layout) == []
    if drv is None:
        return
    for handle in handles:
        assert loops_of(drv.image(handle)) == [], f"{handle} still has a loop device"
        record = drv.volume_record(handle)
        assert record["staged"] is None and record["published"] == {}, record
