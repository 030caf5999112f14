"""An operator's command (``serve --token-command``, ``--cert-command``), run with a bounded time.

`OperatorCommand` splits the option like a shell line and runs it with
extra arguments, environment and stdin. The command runs in a session of
its own: when it outlives `COMMAND_TIMEOUT_S` its whole process group is
killed (a script's children too), so nothing it started lingers holding
the pipes. What it printed is returned to the caller, which decides what
of it may reach an error (never a credential).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

COMMAND_TIMEOUT_S = 30.0
MAX_STDERR_LINE = 200


class CommandError(Exception):
    """The command could not be run or did not finish in time."""


@dataclass(frozen=True)
class CommandResult:
    """What a finished command gave: its exit status and output."""

    returncode: int
    stdout: bytes
    stderr: bytes

    def __repr__(self) -> str:
        return f"CommandResult(returncode={self.returncode})"

    def stderr_line(self) -> str:
        """The first non-blank line of stderr, shortened ("" if none)."""
        for line in self.stderr.decode(errors="replace").splitlines():
            if line.strip():
                text = line.strip()
                return text if len(text) <= MAX_STDERR_LINE else text[:MAX_STDERR_LINE] + "..."
        return ""


class OperatorCommand:
    """`command` split like a shell line; `option` names it in errors (``--token-command``)."""

    def __init__(self, command: str, option: str, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self.argv = shlex.split(command)
        if not self.argv:
            raise ValueError(f"{option} is empty")
        self.option = option
        self.timeout_s = timeout_s

    @property
    def name(self) -> str:
        """The program, for errors."""
        return self.argv[0]

    def run(
        self, args: Sequence[str] = (), env: Mapping[str, str] | None = None, stdin: bytes = b""
    ) -> CommandResult:
        """Run it with `args` appended and `env` added to ours; `CommandError` if it cannot
        start or outlives the timeout (then its process group is killed)."""
        try:
            proc = subprocess.Popen(
                [*self.argv, *args],
                env={**os.environ, **(env or {})},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise CommandError(
                f"{self.option} {self.name!r} failed: {type(exc).__name__}"
            ) from None
        try:
            out, err = proc.communicate(stdin, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CommandError(
                f"{self.option} {self.name!r} did not finish in {self.timeout_s:g}s: killed"
            ) from None
        return CommandResult(proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's process group and reap it (its pipes closed, not drained: a
    descendant that left the group cannot hold us)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    proc.wait()
