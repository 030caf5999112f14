"""Running the node's storage tools (losetup, mount, mkfs.ext4, ...)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from loguru import logger

from volfsm.csidriver.errors import internal

TOOLS = ("losetup", "mount", "umount", "mkfs.ext4", "resize2fs", "e2fsck", "blkid", "dumpe2fs")
"""Programs the driver needs on PATH."""

DEFAULT_TIMEOUT_S = 120.0


class CommandFailed(Exception):
    """A tool exited non-zero (or could not be run)."""

    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        super().__init__(f"{' '.join(args)}: exit {returncode}: {stderr.strip()}")
        self.args_run = list(args)
        self.returncode = returncode
        self.stderr = stderr


def run(
    args: Sequence[str], *, ok_codes: Sequence[int] = (0,), timeout: float = DEFAULT_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run a tool; raise CommandFailed unless its exit code is in ok_codes."""
    logger.debug("run: {}", " ".join(args))
    try:
        proc = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CommandFailed(args, -1, str(err)) from err
    if proc.returncode not in ok_codes:
        raise CommandFailed(args, proc.returncode, proc.stderr or proc.stdout)
    return proc


def run_or_internal(args: Sequence[str], *, ok_codes: Sequence[int] = (0,)) -> str:
    """Run a tool and return its stdout; a failure becomes an INTERNAL CsiError."""
    try:
        return run(args, ok_codes=ok_codes).stdout
    except CommandFailed as err:
        raise internal(str(err)) from err
