"""Loop devices backing volumes: attach, find by backing file, refresh, detach."""

from __future__ import annotations

import os
from pathlib import Path

from volfsm.csidriver.cmd import CommandFailed, run, run_or_internal
from volfsm.csidriver.errors import internal


def find(backing: Path) -> list[str]:
    """Loop devices attached to this backing file (``losetup -j``), sorted by name."""
    if not backing.exists():
        return []
    out = run_or_internal(
        ["losetup", "--noheadings", "--output", "NAME", "--associated", str(backing)]
    )
    return sorted(line.strip() for line in out.splitlines() if line.strip())


def attach(backing: Path) -> str:
    """Attach the file to a free loop device and return the device path."""
    out = run_or_internal(["losetup", "--find", "--show", str(backing)])
    device = out.strip()
    if not device.startswith("/dev/loop"):
        raise internal(f"losetup --find --show {backing}: unexpected output {out!r}")
    return device


def ensure_attached(backing: Path) -> str:
    """The loop device for this file, attaching it if it has none yet."""
    devices = find(backing)
    return devices[0] if devices else attach(backing)


def refresh(device: str) -> None:
    """Make the device pick up a new size of its backing file (``losetup -c``)."""
    run_or_internal(["losetup", "--set-capacity", device])


def detach(device: str) -> None:
    """Detach a loop device; a device that is already gone is fine."""
    try:
        run(["losetup", "--detach", device])
    except CommandFailed as err:
        if "No such device" in err.stderr:
            return
        raise


def detach_all(backing: Path) -> list[str]:
    """Detach every loop device of this backing file; return the ones detached."""
    devices = find(backing)
    for device in devices:
        try:
            detach(device)
        except CommandFailed as err:
            raise internal(str(err)) from err
    return devices


def size_bytes(device: str) -> int:
    """Current size of a block device, from sysfs."""
    name = os.path.basename(device)
    sectors = Path(f"/sys/class/block/{name}/size").read_text().strip()
    return int(sectors) * 512


def dev_number(device: str) -> str:
    """``major:minor`` of a device node, as /proc/self/mountinfo shows it."""
    rdev = os.stat(device).st_rdev
    return f"{os.major(rdev)}:{os.minor(rdev)}"
