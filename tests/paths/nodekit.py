"""Test kit for node-side tests: a janitor for mounts and loop devices, snapshots, loop disks.

The janitor owns one base directory. On cleanup it detaches every loop
device whose backing file lies under the base and lazily unmounts every
mount under it, repeating until none is left, so a failing test never
leaks a mount or a loop device. It touches nothing outside its base.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

from volfsm.node import mounts

SYS_BLOCK = Path("/sys/block")


def loops_backed_under(base: Path) -> list[str]:
    """Loop devices whose backing file is under `base`."""
    prefix = os.fspath(base).rstrip("/") + "/"
    found = []
    for entry in sorted(SYS_BLOCK.glob("loop*")):
        try:
            backing = (entry / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if backing.removesuffix(" (deleted)").startswith(prefix):
            found.append(f"/dev/{entry.name}")
    return found


class Janitor:
    """Creates loop disks under `base` and removes every mount and loop device under it."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def loop_disk(self, name: str = "disk.img", size: int = 16 << 20) -> str:
        """A fresh loop device backed by a sparse file under the base."""
        image = self.base / name
        with open(image, "wb") as fh:
            fh.truncate(size)
        out = subprocess.run(
            ["losetup", "--find", "--show", os.fspath(image)],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()

    def leftovers(self) -> tuple[list[str], list[str]]:
        """(mount points, loop devices) still present under the base."""
        mounted = [info.mount_point for info in mounts.mounts_under(self.base)]
        return mounted, loops_backed_under(self.base)

    def cleanup(self) -> None:
        """Detach loops and unmount everything under the base (lock loops first)."""
        for _ in range(8):
            mounted, loops = self.leftovers()
            if not mounted and not loops:
                return
            # Loops backed by files that are themselves bind mounts go first,
            # then the mounts, then the disks' own loops.
            for device in loops:
                subprocess.run(["losetup", "--detach", device], capture_output=True, check=False)
            for info in mounts.mounts_under(self.base):
                mounts.umount(info.mount_point, lazy=True)
        mounted, loops = self.leftovers()
        assert not mounted and not loops, f"janitor could not clean up: {mounted} {loops}"


Snapshot = dict[str, tuple[object, ...]]


def snapshot(top: Path) -> Snapshot:
    """Everything observable about a tree, links not followed: type, mode, size, mtime, content."""
    shot: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in ["", *dirnames, *filenames]:
            path = Path(dirpath) / name if name else Path(dirpath)
            st = os.lstat(path)
            rel = os.fspath(path.relative_to(top))
            if stat.S_ISLNK(st.st_mode):
                shot[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                shot[rel] = ("file", st.st_mode, st.st_size, st.st_mtime_ns, st.st_nlink, digest)
            else:
                shot[rel] = ("other", st.st_mode, st.st_mtime_ns, st.st_nlink)
    return shot


def build_outside(top: Path) -> Path:
    """An "outside the root" dir holding the trees a followed symlink would reach.

    Every path a volume operation could create or remove below a planted link
    (volumes/, kubernetes.io~empty-dir/, the volume dir's contents, the
    global map dir) already exists here with precious files in it.
    """
    precious = [
        "precious.txt",
        "etc/passwd",
        "volumes/kubernetes.io~empty-dir/vol/precious.txt",
        "kubernetes.io~empty-dir/vol/precious.txt",
        "vol/precious.txt",
        "dev/pod-a/precious.txt",
        "kubernetes.io~csi/vol/precious.txt",
    ]
    for rel in precious:
        path = top / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"do not touch {rel}\n")
    return top
