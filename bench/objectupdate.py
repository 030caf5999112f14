"""ConfigMap change -> every pod using it sees the new content (object_update_ms_p50).

An engine with the real configMap plugin (files on disk, the atomic writer)
and the object-update wiring `volfsm serve` uses (`ObjectUpdates`: a store
listener that remounts the volumes showing a changed object) runs `pods`
pods, each mounting the same ConfigMap. Each trial applies a changed
ConfigMap and waits until every pod's volume was rewritten (its
VolumeMounted durable in the log, the file already swapped in); the files
are then read back to check every pod has the new content. Reported: the
median and p99 over `trials` changes, in ms.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from workdir import scratch

from events.log import EventLog
from events.types import Envelope, VolumeMounted
from volfsm.engine import EngineConfig, VolumeEngine
from volfsm.node.layout import RootLayout
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.objectvol.plugin import ObjectVolumes, object_plugins
from volfsm.plugins.objectvol.updates import ObjectUpdates

CONFIG_MAP = "shared-config"


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


async def object_update(pods: int, trials: int) -> list[float]:
    """ms from apply(changed ConfigMap) to every pod's volume rewritten, per trial."""
    with scratch("volfsm-bench-objupdate-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
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
        updates.close()
        await engine.stop()
        log.close()
    return out


def summary(ms: list[float]) -> dict[str, float]:
    """p50 and p99 of the trials."""
    q = statistics.quantiles(ms, n=100) if len(ms) > 1 else [ms[0]] * 99
    return {"object_update_ms_p50": statistics.median(ms), "object_update_ms_p99": q[98]}


if __name__ == "__main__":
    print(summary(asyncio.run(object_update(100, 20))))
