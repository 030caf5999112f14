"""Run `volfsm serve` as a subprocess, talk to it, read its stream, and clean up after it.

Every process started here is registered, so the session fixture can
check that none is left and kill what a failing test left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.js.api import DeliverPolicy

from events.codec import envelope_to_json
from events.log import EventLog
from events.subjects import events_subject, msg_id, msg_key, node_events_filter, parse_msg_id
from volfsm.bus import free_port
from volfsm.node import mounts

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE = "n1"
STREAM = "VOLFSM"
EXAMPLES = REPO_ROOT / "examples"

LIVE: set[ServeProcess] = set()


class ServeProcess:
    """One `python -m volfsm.cli serve` with its data and root dirs under `workdir`."""

    def __init__(
        self,
        workdir: Path,
        *,
        node: str = NODE,
        nats_url: str | None = None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        own_group: bool = False,
    ) -> None:
        self.workdir = workdir
        self.own_group = own_group
        """Start it as the leader of a process group of its own (as a shell job is)."""
        self.node = node
        self.nats_url = nats_url
        self.args = list(args)
        self.env = env or {}
        self.data_dir = workdir / "data"
        self.root_dir = workdir / "root"
        self.http_port = free_port()
        self.stderr_path = workdir / f"serve-{id(self)}.stderr"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The command line."""
        cmd = [
            sys.executable,
            "-m",
            "volfsm.cli",
            "serve",
            "--node",
            self.node,
            "--data-dir",
            str(self.data_dir),
            "--root-dir",
            str(self.root_dir),
            "--http",
            f"127.0.0.1:{self.http_port}",
            "--log-format",
            "json",
            "--reconcile-period",
            "0.02",
            "--backoff-initial",
            "0.05",
            "--backoff-max",
            "0.5",
        ]
        if self.nats_url:
            cmd += ["--nats", self.nats_url]
        return cmd + self.args

    def start(self, *, wait_ready: bool = True, timeout: float = 60.0) -> ServeProcess:
        """Start it; by default wait until /readyz says ready and commands are taken."""
        env = dict(os.environ)
        env = {k: v for k, v in env.items() if not k.startswith("VOLFSM_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        env.update(self.env)
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                cwd=self.workdir,
                process_group=0 if self.own_group else None,
            )
        LIVE.add(self)
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def alive(self) -> bool:
        """Whether the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until /readyz answers 200 and the log says commands are taken."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"volfsm serve exited early:\n{self.stderr_tail()}")
            status, _ = self.http_get("/readyz")
            if status == 200 and any(
                "taking commands" in line.get("message", "") for line in self.log_lines()
            ):
                return
            time.sleep(0.05)
        raise TimeoutError(f"volfsm serve not ready after {timeout}s:\n{self.stderr_tail()}")

    def http_get(self, path: str, method: str = "GET") -> tuple[int, str]:
        """(status, body) of one request to the service's HTTP server; (0, '') if refused."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}", method=method)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, ""

    @property
    def url(self) -> str:
        """The NATS URL the service uses (from its nats.url file)."""
        return self.nats_url or (self.data_dir / "nats.url").read_text().strip()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send `sig` and wait for the exit code (SIGKILL after `timeout`)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        LIVE.discard(self)
        return int(self.proc.returncode)

    def kill(self) -> None:
        """SIGKILL (cleanup)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        LIVE.discard(self)

    def stderr_text(self) -> str:
        """Everything the service logged."""
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def stderr_tail(self, lines: int = 40) -> str:
        """The last lines of the log."""
        return "\n".join(self.stderr_text().splitlines()[-lines:])

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON log lines (others, e.g. a traceback of a crash, are skipped)."""
        out = []
        for line in self.stderr_text().splitlines():
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict):
                    out.append(item)
        return out

    def open_log(self) -> EventLog:
        """The service's event log, read-only."""
        return EventLog(self.data_dir / "volfsm.db", readonly=True)


def kill_all() -> list[int]:
    """Kill every service still registered; their pids."""
    pids = [p.proc.pid for p in LIVE if p.proc is not None and p.alive()]
    for proc in list(LIVE):
        proc.kill()
    return pids


def unmount_under(path: Path) -> None:
    """Unmount everything under `path`, deepest first."""
    for _ in range(3):
        found = mounts.mounts_under(path)
        if not found:
            return
        for info in sorted(found, key=lambda m: m.mount_point.count("/"), reverse=True):
            with contextlib.suppress(Exception):
                mounts.umount(info.mount_point, lazy=True)


# ----------------------------------------------------------------- NATS


class SyncNats:
    """A NATS connection usable from synchronous tests (its own event loop)."""

    def __init__(self, url: str, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.nc: NATS = self.loop.run_until_complete(
            nats.connect(url, allow_reconnect=False, max_reconnect_attempts=1, **options)
        )

    def request(self, subject: str, data: bytes, timeout: float = 10.0) -> bytes:
        """One request; the reply's bytes."""
        msg = self.loop.run_until_complete(self.nc.request(subject, data, timeout=timeout))
        return bytes(msg.data)

    def close(self) -> None:
        """Close the connection and the loop."""
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(self.nc.close())
        self.loop.close()


@dataclass(frozen=True)
class StreamedEvent:
    """One event as the stream holds it (or as it should)."""

    subject: str
    msg_id: str
    data: bytes


def expected_stream(log: EventLog, node: str = NODE) -> list[StreamedEvent]:
    """What the stream must hold: every logged event once, in seq order."""
    key = msg_key(log.log_id)
    return [
        StreamedEvent(
            events_subject(node, env.type), msg_id(node, env.seq, key), envelope_to_json(env)
        )
        for env in log.read_after(0)
    ]


def keyless(events: list[StreamedEvent]) -> list[tuple[str, tuple[str, int], bytes]]:
    """`events` with each msg id as (node, seq): a log restored from the stream has a new
    msg key, while the events it got back keep the ids they were published with."""
    return [(e.subject, parse_msg_id(e.msg_id), e.data) for e in events]


async def read_stream_async(
    url: str, node: str, stream: str, **options: Any
) -> list[StreamedEvent]:
    nc = await nats.connect(url, **options)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream, subjects_filter=node_events_filter(node))
        total = sum((info.state.subjects or {}).values())
        sub = await js.subscribe(
            node_events_filter(node),
            stream=stream,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )
        out: list[StreamedEvent] = []
        try:
            while len(out) < total:
                msg = await sub.next_msg(timeout=10)
                out.append(
                    StreamedEvent(msg.subject, (msg.headers or {}).get("Nats-Msg-Id", ""), msg.data)
                )
        finally:
            await sub.unsubscribe()
        return out
    finally:
        await nc.close()


def read_stream(
    url: str, node: str = NODE, stream: str = STREAM, **options: Any
) -> list[StreamedEvent]:
    """Every event of `node` in `stream`, read with an ordered push consumer."""
    return asyncio.run(read_stream_async(url, node, stream, **options))


def cli(svc: ServeProcess, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    """Run `volfsm ARGS --data-dir <svc's>` in-process: (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from volfsm.cli import app

    result = CliRunner().invoke(app, [*args, "--data-dir", str(svc.data_dir)], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll `check` until it returns something truthy (returned); fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not after {timeout}s: {what} (last: {found!r})")
        time.sleep(0.05)
