"""Benchmark of CSI volume handling: the driver alone, through the plugin, through volfsm.

Run `python bench/csi.py` as root. It starts volfsm's CSI driver on a unix
socket, creates N filesystem volumes (default 50) and formats them once
(untimed: stage + unstage), then measures, per round and per mode, the time
to bring all N volumes up (stage + publish) and down again (unpublish +
unstage), all volumes concurrently, each volume's calls in order:

* direct_s: gRPC calls straight to the driver (a bare CO: mkdir the staging
  dir and the target's parent, call, rmdir);
* plugin_s: the same through `CsiPlugin` (kubelet layout, vol_data.json,
  mountinfo checks after each call, cleanup);
* volfsm_s: N pods (one PV/PVC each) applied to a `VolumeEngine`, waited
  until mounted, deleted, waited until every device is unstaged and
  detached (see `run_volfsm`).

Modes alternate within each round, after one untimed warm-up round; the
figures are medians over the timed rounds.
It prints one human line per figure and, last, one JSON object with
direct_s, plugin_s, plugin_overhead_ratio (plugin_s / direct_s), volfsm_s
and overhead_ratio (volfsm_s / direct_s; target <= 1.25). If the engine
part fails, volfsm_s and overhead_ratio are null and the error is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from loguru import logger  # noqa: E402

from events.types import VolumeSource  # noqa: E402
from volfsm.csi.v1 import csi_pb2, csi_pb2_grpc  # noqa: E402
from volfsm.node.layout import CSI_PLUGIN, RootLayout  # noqa: E402
from volfsm.plugins.base import VolumeRequest  # noqa: E402
from volfsm.plugins.csi.plugin import CsiPlugin  # noqa: E402

DRIVER = "csi.volfsm.dev"
NODE = "bench-node"
MIB = 1 << 20
Mode = csi_pb2.VolumeCapability.AccessMode.Mode

Timed = Callable[[int], Awaitable[float]]


# ------------------------------------------------------------------ the driver


class Driver:
    """volfsm's CSI driver as a subprocess, with its state under `workdir`."""

    def __init__(self, workdir: Path, workers: int) -> None:
        self.workdir = workdir
        self.socket_dir = Path(tempfile.mkdtemp(prefix="vcsi-bench-", dir="/tmp"))
        self.endpoint = f"unix://{self.socket_dir}/csi.sock"
        self.state_dir = workdir / "driver-state"
        self.log_path = workdir / "driver.log"
        self.workers = workers
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start and wait until Probe answers."""
        cmd = [
            sys.executable,
            "-m",
            "volfsm.csidriver",
            "--endpoint",
            self.endpoint,
            "--node-id",
            NODE,
            "--state-dir",
            str(self.state_dir),
            "--name",
            DRIVER,
            "--workers",
            str(self.workers),
            "--log-level",
            "WARNING",
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"driver exited: {self.log_path.read_text()[-2000:]}")
            with grpc.insecure_channel(self.endpoint) as channel:
                try:
                    csi_pb2_grpc.IdentityStub(channel).Probe(csi_pb2.ProbeRequest(), timeout=2)
                    return
                except grpc.RpcError:
                    pass
            time.sleep(0.05)
        raise TimeoutError("driver did not answer Probe")

    def create_volumes(self, count: int, size: int) -> list[str]:
        """CreateVolume `count` times; the handles."""
        cap = _mount_capability()
        handles = []
        with grpc.insecure_channel(self.endpoint) as channel:
            controller = csi_pb2_grpc.ControllerStub(channel)
            for index in range(count):
                resp = controller.CreateVolume(
                    csi_pb2.CreateVolumeRequest(
                        name=f"bench-{index:03d}",
                        capacity_range=csi_pb2.CapacityRange(required_bytes=size),
                        volume_capabilities=[cap],
                    ),
                    timeout=60,
                )
                handles.append(resp.volume.volume_id)
        return handles

    def stop(self) -> None:
        """SIGTERM (then SIGKILL) and remove the socket dir."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(20)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def _mount_capability() -> Any:
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type="ext4"),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=Mode.SINGLE_NODE_WRITER),
    )


# ------------------------------------------------------------------ direct


class Direct:
    """Stage/publish/unpublish/unstage straight over gRPC, as a bare CO would."""

    def __init__(self, endpoint: str, base: Path, handles: list[str]) -> None:
        self.endpoint = endpoint
        self.base = base
        self.handles = handles

    def _paths(self, handle: str, round_no: int) -> tuple[Path, Path]:
        staging = self.base / "staging" / handle
        target = self.base / "pods" / f"r{round_no}-{handle}" / "mount"
        return staging, target

    async def _up(self, node: Any, handle: str, round_no: int) -> None:
        staging, target = self._paths(handle, round_no)
        cap = _mount_capability()
        await asyncio.to_thread(staging.mkdir, parents=True, exist_ok=True)
        await node.NodeStageVolume(
            csi_pb2.NodeStageVolumeRequest(
                volume_id=handle, staging_target_path=str(staging), volume_capability=cap
            ),
            timeout=120,
        )
        await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
        await node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id=handle,
                staging_target_path=str(staging),
                target_path=str(target),
                volume_capability=cap,
            ),
            timeout=120,
        )

    async def _down(self, node: Any, handle: str, round_no: int) -> None:
        staging, target = self._paths(handle, round_no)
        await node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=handle, target_path=str(target)),
            timeout=120,
        )
        await asyncio.to_thread(target.parent.rmdir)
        await node.NodeUnstageVolume(
            csi_pb2.NodeUnstageVolumeRequest(volume_id=handle, staging_target_path=str(staging)),
            timeout=120,
        )
        await asyncio.to_thread(staging.rmdir)

    async def format_all(self) -> None:
        """Untimed first stage + unstage of every volume (mkfs happens here)."""
        await self.run(-2)

    async def run(self, round_no: int) -> float:
        """Seconds to bring every volume up, then down."""
        async with grpc.aio.insecure_channel(
            self.endpoint, options=[("grpc.default_authority", "localhost")]
        ) as channel:
            node = csi_pb2_grpc.NodeStub(channel)
            await node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(), timeout=10)
            start = time.perf_counter()
            await asyncio.gather(*(self._up(node, h, round_no) for h in self.handles))
            await asyncio.gather(*(self._down(node, h, round_no) for h in self.handles))
            return time.perf_counter() - start


# ------------------------------------------------------------------ plugin


class ThroughPlugin:
    """The same through `CsiPlugin` with the kubelet layout under its own root."""

    def __init__(self, endpoint: str, root: Path, handles: list[str]) -> None:
        self.layout = RootLayout(root)
        self.endpoint = endpoint
        self.handles = handles

    def _requests(self, plugin: CsiPlugin, handle: str, uid: str) -> tuple[Any, Any]:
        src = VolumeSource(
            plugin=CSI_PLUGIN,
            driver=DRIVER,
            volume_handle=handle,
            fs_type="ext4",
            access_modes=("ReadWriteOnce",),
        )
        base = VolumeRequest(
            volume_id=f"{CSI_PLUGIN}/{DRIVER}^{handle}", source=src, spec_name=f"pv-{handle}"
        )
        root = self.layout.root
        dev = replace(base, device_mount_path=plugin.device_mount_path(root, base))
        pod = replace(dev, pod_uid=uid, volume_name="data")
        pod = replace(pod, mount_path=plugin.pod_mount_path(root, pod))
        return dev, pod

    async def run(self, round_no: int) -> float:
        """Seconds to bring every volume up, then down, through the plugin."""
        plugin = CsiPlugin(DRIVER, self.endpoint, self.layout, node_name=NODE)
        await plugin.start()
        reqs = [
            self._requests(plugin, h, f"plugin-r{round_no}-{i}") for i, h in enumerate(self.handles)
        ]

        async def up(dev: Any, pod: Any) -> None:
            await plugin.mount_device(dev)
            await plugin.set_up(pod)

        async def down(dev: Any, pod: Any) -> None:
            await plugin.tear_down(pod)
            await plugin.unmount_device(dev)

        try:
            start = time.perf_counter()
            await asyncio.gather(*(up(d, p) for d, p in reqs))
            await asyncio.gather(*(down(d, p) for d, p in reqs))
            return time.perf_counter() - start
        finally:
            await plugin.stop()


# ------------------------------------------------------------------ volfsm


class ThroughVolfsm:
    """The same 50 volumes as pods through a `VolumeEngine` (the kubelet's volume manager)."""

    def __init__(self, endpoint: str, workdir: Path, handles: list[str]) -> None:
        self.endpoint = endpoint
        self.workdir = workdir
        self.handles = handles
        self.engine: Any = None
        self.plugin: CsiPlugin | None = None
        self.log: Any = None

    async def start(self) -> None:
        """Open a log, register the driver's plugin, start the engine, apply PVs and PVCs."""
        from events.log import EventLog
        from volfsm.engine import EngineConfig, VolumeEngine
        from volfsm.plugins.catalog import PluginCatalog

        root = self.workdir / "root-engine"
        root.mkdir(parents=True, exist_ok=True)
        self.log = EventLog(self.workdir / "volfsm.db", node=NODE)
        layout = RootLayout(root)
        self.plugin = CsiPlugin(DRIVER, self.endpoint, layout, node_name=NODE)
        await self.plugin.start()
        catalog = PluginCatalog()
        catalog.register_csi_driver(DRIVER, self.plugin)
        self.engine = VolumeEngine(self.log, root, catalog, EngineConfig())
        await self.engine.start()
        objects: list[dict[str, Any]] = []
        for handle in self.handles:
            objects += [_pv(f"pv-{handle}", handle), _pvc(f"pvc-{handle}", f"pv-{handle}")]
        await self.engine.apply(objects)

    async def run(self, round_no: int) -> float:
        """Seconds from applying N pods to every device detached again after deleting them."""
        engine = self.engine
        uids = [f"vf-r{round_no}-{i}" for i in range(len(self.handles))]
        pods = [_pod(uid, f"pvc-{h}") for uid, h in zip(uids, self.handles, strict=True)]
        start = time.perf_counter()
        await engine.apply(pods)
        await asyncio.gather(*(engine.wait_pod(uid, "mounted", timeout=300) for uid in uids))
        for uid in uids:
            await engine.delete_pod(uid=uid)
        await asyncio.gather(*(engine.wait_pod(uid, "unmounted", timeout=300) for uid in uids))
        await self._wait_devices_gone(timeout=300)
        return time.perf_counter() - start

    async def _wait_devices_gone(self, timeout: float) -> None:
        from events.tables import DETACHED

        deadline = time.monotonic() + timeout
        while True:
            busy = [v for v, d in self.engine.asw.devices.items() if d.state != DETACHED]
            if not busy:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"devices not unstaged: {busy[:5]}")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Stop the engine, the plugin's channel and the log."""
        if self.engine is not None:
            await self.engine.stop()
        if self.plugin is not None:
            await self.plugin.stop()
        if self.log is not None:
            self.log.close()


def _pv(name: str, handle: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "csi": {"driver": DRIVER, "volumeHandle": handle, "fsType": "ext4"},
            "capacity": {"storage": "32Mi"},
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteOnce"],
        },
    }


def _pvc(name: str, volume: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {"volumeName": volume, "volumeMode": "Filesystem"},
        "status": {"phase": "Bound"},
    }


def _pod(uid: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{uid}", "namespace": "bench", "uid": uid},
        "spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
    }


# ------------------------------------------------------------------ cleanup


def cleanup(workdir: Path) -> None:
    """Unmount everything under workdir and detach loop devices backed there (after a failure)."""
    base = str(workdir.resolve())
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4] for line in fh]
    for point in sorted((p for p in points if p.startswith(base)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    out = subprocess.run(
        ["losetup", "-n", "-l", "-O", "NAME,BACK-FILE"], capture_output=True, text=True
    ).stdout
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip().startswith(base):
            subprocess.run(["losetup", "-d", parts[0]], capture_output=True, check=False)


# ------------------------------------------------------------------ main


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    driver = Driver(workdir, args.workers)
    driver.start()
    volfsm: ThroughVolfsm | None = None
    try:
        handles = driver.create_volumes(args.volumes, args.size_mib * MIB)
        direct = Direct(driver.endpoint, workdir / "direct", handles)
        await direct.format_all()
        through = ThroughPlugin(driver.endpoint, workdir / "root-plugin", handles)
        modes: dict[str, Timed] = {"direct_s": direct.run, "plugin_s": through.run}
        engine_error = ""
        if not args.no_engine:
            try:
                volfsm = ThroughVolfsm(driver.endpoint, workdir, handles)
                await volfsm.start()
                modes["volfsm_s"] = volfsm.run
            except Exception:
                engine_error = traceback.format_exc()
        times: dict[str, list[float]] = {name: [] for name in modes}
        for round_no in range(-1, args.rounds):  # round -1 warms every mode up, untimed
            for name, run in list(modes.items()):
                try:
                    took = await run(round_no)
                    if round_no >= 0:
                        times[name].append(took)
                except Exception:
                    if name != "volfsm_s":
                        raise
                    engine_error = traceback.format_exc()
                    del modes[name]
                    times[name] = []
        if engine_error:
            print(f"volfsm_s failed:\n{engine_error}", file=sys.stderr)
        return {name: statistics.median(vals) if vals else None for name, vals in times.items()}
    finally:
        if volfsm is not None:
            try:
                await volfsm.stop()
            except Exception:
                traceback.print_exc()
        driver.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--volumes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=32)
    parser.add_argument("--workers", type=int, default=16, help="driver gRPC worker threads")
    parser.add_argument("--no-engine", action="store_true", help="skip volfsm_s")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/csi.py must run as root (loop devices, mounts)", file=sys.stderr)
        return 2
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    workdir = Path(tempfile.mkdtemp(prefix="volfsm-bench-csi-"))
    try:
        figures = asyncio.run(measure(args, workdir))
    finally:
        cleanup(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
    direct_s = figures["direct_s"]
    plugin_s = figures["plugin_s"]
    volfsm_s = figures.get("volfsm_s")
    result = {
        "volumes": args.volumes,
        "rounds": args.rounds,
        "direct_s": round(direct_s, 4),
        "plugin_s": round(plugin_s, 4),
        "plugin_overhead_ratio": round(plugin_s / direct_s, 3),
        "volfsm_s": round(volfsm_s, 4) if volfsm_s is not None else None,
        "overhead_ratio": round(volfsm_s / direct_s, 3) if volfsm_s is not None else None,
    }
    print(f"direct  {args.volumes} volumes up+down: {direct_s:.3f} s (median of {args.rounds})")
    print(
        f"plugin  {args.volumes} volumes up+down: {plugin_s:.3f} s "
        f"(x{result['plugin_overhead_ratio']})"
    )
    if volfsm_s is not None:
        print(
            f"volfsm  {args.volumes} pods mounted+gone: {volfsm_s:.3f} s "
            f"(x{result['overhead_ratio']}; target <= 1.25)"
        )
    else:
        print("volfsm  not measured (see the error above)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
