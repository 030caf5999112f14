"""ConfigMap change -> every pod using it sees the new content (object_update_ms_p50).

An engine with the real configMap plugin (files on disk, the atomic writer)
and the object-update wiring `volfsm serve` uses (`ObjectUpdates`: a store
listener that remounts the volumes showing a changed object) runs `pods`
pods, each mounting the same ConfigMap. Each trial applies a changed
ConfigMap and waits until every pod's volume was rewritten (its
VolumeMounted durable in the log, the file already swapped in); the files
are then read back to check every pod has the new content, and the old
payload dirs' removal (the reaper's, after the swap) is waited for, off the
measured path. Reported: the median and p99 over `trials` changes, in ms.

`tmpfs=True` puts the root dir (the volumes, not the log) on /dev/shm: the
medium of secret, downwardAPI and projected volumes. The peer, `bare_rewrites`,
is the same rewrites done by the `AtomicWriter` alone, one after the other in
one thread, on the same medium: the file work without the engine, the log
or the store.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workdir import scratch

from events.log import EventLog
from events.types import Envelope, VolumeMounted
from volfsm.engine import EngineConfig, VolumeEngine
from volfsm.node.atomicwriter import AtomicWriter, DirReaper, FileProjection
from volfsm.node.layout import RootLayout
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.objectvol.plugin import ObjectVolumes, object_plugins
from volfsm.plugins.objectvol.updates import ObjectUpdates

CONFIG_MAP = "shared-config"
SHM = Path("/dev/shm")


def config_map(version: int) -> dict[str, Any]:
    """The shared ConfigMap at `version`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": "default"},
        "data": {"version": str(version), "app.properties": f"generation={version}\n" * 20},
    }


def pod(i: int) -> dict[str, Any]:
    """Pod `i` mounting the shared ConfigMap."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": "default", "uid": f"uid-{i}"},
        "spec": {"volumes": [{"name": "cfg", "configMap": {"name": CONFIG_MAP}}]},
    }


def _version_file(root: Path, i: int) -> Path:
    return root / "pods" / f"uid-{i}" / "volumes" / "kubernetes.io~configmap" / "cfg" / "version"


@contextmanager
def root_dir(tmp: Path, tmpfs: bool) -> Iterator[Path]:
    """The root dir: in the scratch dir, or on /dev/shm (removed at the end)."""
    base = Path(tempfile.mkdtemp(prefix="volfsm-bench-objroot-", dir=SHM)) if tmpfs else tmp
    root = base / "root"
    root.mkdir()
    try:
        yield root
    finally:
        if tmpfs:
            shutil.rmtree(base, ignore_errors=True)


async def object_update(pods: int, trials: int, tmpfs: bool = False) -> list[float]:
    """ms from apply(changed ConfigMap) to every pod's volume rewritten, per trial."""
    with scratch("volfsm-bench-objupdate-") as tmp, root_dir(Path(tmp), tmpfs) as root:
        log = EventLog(Path(tmp) / "volfsm.db", node="bench")
        shared = ObjectVolumes()
        catalog = PluginCatalog()
        for plugin in object_plugins(RootLayout(root), shared):
            catalog.register(plugin)
        engine = VolumeEngine(log, root, catalog, EngineConfig())
        shared.store = engine.objects
        updates = ObjectUpdates(engine.objects, engine, shared, asyncio.get_running_loop())
        await engine.start()
        written: set[str] = set()
        done = asyncio.Event()

        def listener(envs: list[Envelope]) -> None:
            for env in envs:
                if isinstance(env.body, VolumeMounted) and env.body.contents.startswith("written"):
                    written.add(env.body.pod_uid)
            if len(written) == pods:
                done.set()

        engine.handler.subscribe(listener)
        await engine.apply([config_map(0), *(pod(i) for i in range(pods))])
        for i in range(pods):
            await engine.wait_pod(f"uid-{i}", "mounted", timeout=60)
        await engine.settle(60)  # the remount the first apply's ConfigMap asked for, too
        shared.reaper.wait_idle(60)
        out = []
        for version in range(1, trials + 1):
            written.clear()
            done.clear()
            t0 = time.perf_counter()
            await engine.apply([config_map(version)])
            await asyncio.wait_for(done.wait(), timeout=60)
            out.append((time.perf_counter() - t0) * 1000)
            seen = {_version_file(root, i).read_text() for i in range(pods)}
            assert seen == {str(version)}, f"pods saw {seen} after version {version}"
            shared.reaper.wait_idle(60)  # the replaced dirs' removal, off the measured path
        updates.close()
        await engine.stop()
        log.close()
    return out


def _files(version: int) -> dict[str, FileProjection]:
    return {k: FileProjection(v.encode()) for k, v in config_map(version)["data"].items()}


def bare_rewrites(pods: int, trials: int, tmpfs: bool = False) -> list[float]:
    """The peer: ms for `pods` volume dirs rewritten by the AtomicWriter alone, per trial."""
    with scratch("volfsm-bench-objbare-") as tmp, root_dir(Path(tmp), tmpfs) as root:
        reaper = DirReaper()
        writers = []
        for i in range(pods):
            (root / f"v{i}").mkdir()
            writers.append(AtomicWriter(root / f"v{i}", retire=reaper.retire))
            writers[-1].write(_files(0))
        out = []
        for version in range(1, trials + 1):
            reaper.wait_idle(60)
            files = _files(version)
            t0 = time.perf_counter()
            for writer in writers:
                writer.write(files)
            out.append((time.perf_counter() - t0) * 1000)
        reaper.wait_idle(60)
    return out


def summary(ms: list[float], key: str = "object_update_ms") -> dict[str, float]:
    """p50 and p99 of the trials."""
    q = statistics.quantiles(ms, n=100) if len(ms) > 1 else [ms[0]] * 99
    return {f"{key}_p50": statistics.median(ms), f"{key}_p99": q[98]}


def run_all(pods: int, trials: int) -> dict[str, float]:
    """Engine and bare peer, on the scratch dir's disk and on tmpfs (if /dev/shm is one)."""
    out = summary(asyncio.run(object_update(pods, trials)))
    out |= summary(bare_rewrites(pods, trials), "object_update_bare_ms")
    if SHM.is_dir():
        out |= summary(
            asyncio.run(object_update(pods, trials, tmpfs=True)), "object_update_tmpfs_ms"
        )
        out |= summary(bare_rewrites(pods, trials, tmpfs=True), "object_update_tmpfs_bare_ms")
    return out


if __name__ == "__main__":
    for name, value in run_all(100, 20).items():
        print(f"{name}: {value:.1f}")
