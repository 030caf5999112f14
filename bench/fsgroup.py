"""The fsGroup ownership pass against ``chown -R`` + ``chmod -R g+rwX`` of the same tree.

Two identical trees of `files` empty files (root-owned, 0644, in directories of
1,000) are made in a scratch dir; volfsm's `set_volume_ownership` walks one,
the tools the other, in the same run. `fsgroup_files_per_s` is volfsm's rate;
`fsgroup_ratio` is volfsm's time over the tools' (target <= 1.5).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from workdir import scratch

from volfsm.node.ownership import set_volume_ownership

FS_GROUP = 4321
PER_DIR = 1000


def make_tree(root: Path, files: int) -> None:
    """`files` empty 0644 files under `root`, PER_DIR per directory."""
    root.mkdir()
    flags = os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC
    for d in range(max(files // PER_DIR, 1)):
        sub = root / f"d{d}"
        sub.mkdir()
        for f in range(min(PER_DIR, files)):
            os.close(os.open(sub / f"f{f}", flags, 0o644))


def fsgroup(files: int) -> dict[str, float]:
    """Both passes over `files` files: volfsm's rate, both times and their ratio."""
    with scratch("volfsm-bench-fsgroup-") as tmp:
        ours, tools = Path(tmp) / "ours", Path(tmp) / "tools"
        make_tree(ours, files)
        make_tree(tools, files)
        started = time.monotonic()
        result = set_volume_ownership(ours, FS_GROUP)
        ours_s = time.monotonic() - started
        started = time.monotonic()
        subprocess.run(["chown", "-R", f":{FS_GROUP}", str(tools)], check=True)
        subprocess.run(["chmod", "-R", "g+rwX", str(tools)], check=True)
        tools_s = time.monotonic() - started
    return {
        "fsgroup_files_per_s": result.entries / ours_s,
        "fsgroup_s": ours_s,
        "fsgroup_tools_s": tools_s,
        "fsgroup_ratio": ours_s / tools_s,
    }
