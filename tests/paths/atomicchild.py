"""A child process for the atomic writer's crash tests: writes payloads, SIGKILLs itself.

``python -m tests.paths.atomicchild DIR VERSION STEP`` writes `payload(VERSION)`
into DIR and kills itself with SIGKILL when the writer reaches STEP;
``... DIR loop -`` writes versions 1, 2, 1, 2, ... until killed.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from volfsm.node.atomicwriter import AtomicWriter, FileProjection

FILE_BYTES = 256 * 1024


def payload(version: int) -> dict[str, FileProjection]:
    """Version `version`'s files: every byte says the version; odd versions add `extra`."""
    mark = str(version % 10).encode()
    files = {
        "a": FileProjection(mark * FILE_BYTES),
        "b": FileProjection(mark * FILE_BYTES, mode=0o600),
        "sub/dir/c": FileProjection(mark * 1024, mode=0o640),
    }
    if version % 2:
        files["extra"] = FileProjection(mark * 16)
    return files


def expected(version: int) -> dict[str, bytes]:
    """What `read_payload` must give after `payload(version)` was written."""
    return {path: p.data for path, p in payload(version).items()}


def _kill_at(step: str) -> Callable[[str], None]:
    def on_step(name: str) -> None:
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)

    return on_step


def main(argv: list[str]) -> None:
    """Run as the module doc says."""
    target, version, step = Path(argv[0]), argv[1], argv[2]
    if version == "loop":
        writer = AtomicWriter(target)
        for v in itertools.cycle((1, 2)):
            writer.write(payload(v))
    AtomicWriter(target, on_step=_kill_at(step)).write(payload(int(version)))


if __name__ == "__main__":
    main(sys.argv[1:])
