"""An engine process that a fault point kills: `python -m tests.reconstruct.crashing ROOT DB FILE`.

It starts a `VolumeEngine` (emptyDir plugin) on ROOT and the log DB,
applies the objects in the JSON FILE and waits for every pod in it to be
mounted. Arm a fault point with VOLFSM_FAULT_POINT and it dies by SIGKILL
in the middle; if it is not killed it exits 3 (the test then fails).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from events.log import EventLog
from tests.engine.conftest import FAST
from volfsm.engine import VolumeEngine
from volfsm.node.layout import RootLayout
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.emptydir import EmptyDirPlugin

NOT_KILLED = 3


async def run(root: Path, db: Path, objects_file: Path) -> int:
    objects = json.loads(objects_file.read_text())
    log = EventLog(db, node="node-1")
    catalog = PluginCatalog()
    catalog.register(EmptyDirPlugin(RootLayout(root)))
    engine = VolumeEngine(log, root, catalog, FAST)
    await engine.start()
    await engine.apply(objects)
    for obj in objects:
        if obj.get("kind") == "Pod":
            await engine.wait_pod(obj["metadata"]["uid"], "mounted", timeout=60)
    await engine.stop()
    log.close()
    return NOT_KILLED


if __name__ == "__main__":
    sys.exit(asyncio.run(run(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))))
