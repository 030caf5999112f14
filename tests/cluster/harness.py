"""The many-nodes harness: real `volfsm serve` nodes, their workloads, and the aggregator process.

`Commander` drives the nodes' command intake over one NATS connection to
the cluster (apply / delete / get pods), retrying through outages: a
request that times out while a server is down is sent again, which the
intake's idempotent apply and delete make harmless. `Workload` runs mixed
emptyDir pod cycles on one node: a plain directory, a tmpfs (medium:
Memory), both, and a pod whose directory is blocked by a file so its
mount fails (UnsafePath, retried) until the test removes the file.
`AggregatorProcess` runs `volfsm analytics serve` through the main CLI.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client

from events.subjects import command_subject
from tests.service.helpers import ServeProcess
from volfsm.bus import free_port
from volfsm.node.layout import RootLayout

REPO_ROOT = Path(__file__).resolve().parents[2]
EMPTY_DIR = "kubernetes.io~empty-dir"
REQUEST_TIMEOUT_S = 5.0
COMMAND_DEADLINE_S = 90.0


async def wait_for(
    condition: str,
    check: Callable[[], object],
    timeout_s: float = 90.0,
    detail: Callable[[], str] = lambda: "",
) -> None:
    """Poll `check()` (in a worker thread) until truthy; fail naming `condition` after a while."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await asyncio.to_thread(check):
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {condition}\n{detail()}")
        await asyncio.sleep(0.1)


def fetch(url: str) -> tuple[int, bytes]:
    """(status, body) of a GET; (0, b'') if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())
    except OSError:
        return 0, b""


# ------------------------------------------------------------------ nodes


class Node:
    """One `volfsm serve` node of the test (a `ServeProcess`) that can also be paused."""

    def __init__(self, workdir: Path, name: str, nats_url: str, args: Sequence[str]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.proc = ServeProcess(workdir, node=name, nats_url=nats_url, args=args)
        self.paused = False

    @property
    def root_dir(self) -> Path:
        """The node's kubelet-style root dir."""
        return self.proc.root_dir

    def pause(self) -> None:
        """SIGSTOP: the node stops doing anything, its events stop arriving."""
        assert self.proc.proc is not None
        self.proc.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT."""
        if self.proc.proc is not None and self.proc.alive():
            self.proc.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self) -> int:
        """SIGTERM (drain: finish, flush the relay) and the exit code."""
        self.resume()
        return self.proc.stop()

    def kill(self) -> None:
        """SIGKILL if still running (cleanup)."""
        self.resume()
        self.proc.kill()


# --------------------------------------------------------------- commands


class Commander:
    """Sends node commands over one NATS connection to every server of the cluster."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc

    @classmethod
    async def connect(cls, urls: list[str], **options: Any) -> Commander:
        """Connect (reconnecting forever to any of `urls`); `options`: credentials, inbox."""
        nc = await nats.connect(
            servers=urls,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            connect_timeout=2,
            **options,
        )
        return cls(nc)

    async def close(self) -> None:
        """Close the connection."""
        await self.nc.close()

    async def request(self, node: str, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """One command, retried while NATS or the node does not answer; the reply."""
        subject = command_subject(node, verb)
        payload = json.dumps(body).encode()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COMMAND_DEADLINE_S
        while True:
            try:
                msg = await self.nc.request(subject, payload, timeout=REQUEST_TIMEOUT_S)
            except (
                nats.errors.TimeoutError,
                nats.errors.NoRespondersError,
                nats.errors.ConnectionReconnectingError,
                TimeoutError,
            ) as exc:
                if loop.time() > deadline:
                    raise AssertionError(f"{node} {verb}: no answer ({exc!r})") from exc
                await asyncio.sleep(0.2)
                continue
            reply: dict[str, Any] = json.loads(msg.data)
            return reply

    async def declare_complete(self, node: str) -> None:
        """Tell the node its desired state is complete (empty): unmounts may start at once.

        A fresh `volfsm serve` unmounts nothing until told so or until its
        desired-state grace period has passed (kubelet's readyToUnmount).
        """
        reply = await self.request(node, "apply", {"objects": [], "complete": True})
        assert reply["ok"], reply

    async def pod(self, node: str, uid: str) -> dict[str, Any] | None:
        """The node's view of one pod (None if it does not know it)."""
        reply = await self.request(node, "get", {"what": "pods", "uid": uid})
        assert reply["ok"], reply
        items: list[dict[str, Any]] = reply["items"]
        return items[0] if items else None

    async def until_pod(
        self, node: str, uid: str, check: Callable[[dict[str, Any] | None], bool], what: str
    ) -> None:
        """Poll the pod until `check` holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COMMAND_DEADLINE_S
        while True:
            pod = await self.pod(node, uid)
            if check(pod):
                return
            if loop.time() > deadline:
                raise AssertionError(f"{node}: pod {uid} not {what}: {pod}")
            await asyncio.sleep(0.05)


def pod_object(uid: str, volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """A Pod with these volumes (namespace default, named after its uid)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "default", "name": uid, "uid": uid},
        "spec": {"volumes": volumes},
    }


DIR = {"name": "data", "emptyDir": {}}
MEMORY = {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}
KINDS: dict[str, list[dict[str, Any]]] = {
    "dir": [DIR],
    "mem": [MEMORY],
    "both": [DIR, MEMORY],
    "blocked": [DIR, MEMORY],
}


def mounted(pod: dict[str, Any] | None) -> bool:
    """Desired with every volume Mounted."""
    return pod is not None and bool(pod.get("desired")) and pod.get("phase") == "Mounted"


def gone(pod: dict[str, Any] | None) -> bool:
    """Unknown to the node, or not desired and holding no volume."""
    return pod is None or (not pod.get("desired") and pod.get("phase") == "Gone")


def failed_once(pod: dict[str, Any] | None) -> bool:
    """Some volume of the pod has a recorded failure."""
    return pod is not None and any(v.get("last_error") for v in pod.get("volumes") or [])


class Workload:
    """Pod cycles on one node: apply, wait mounted, delete, wait gone."""

    def __init__(self, commander: Commander, node: Node) -> None:
        self.cmd = commander
        self.node = node
        self.cycles = 0

    def blocker(self, uid: str) -> Path:
        """Where a file blocks the `data` volume dir of pod `uid`."""
        return RootLayout(self.node.root_dir).pod_volume_dir(uid, EMPTY_DIR, DIR["name"])

    async def apply(self, uid: str, kind: str) -> None:
        """Apply a pod of `kind` (a blocked one gets its blocker file first)."""
        if kind == "blocked":
            path = self.blocker(uid)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("in the way\n")
        reply = await self.cmd.request(
            self.node.name, "apply", {"objects": [pod_object(uid, KINDS[kind])]}
        )
        assert reply["ok"], reply

    async def unblock(self, uid: str) -> None:
        """Wait until the blocked pod's mount failed, then remove the blocker."""
        await self.cmd.until_pod(self.node.name, uid, failed_once, "failed once")
        self.blocker(uid).unlink()

    async def finish(self, uid: str) -> None:
        """Wait mounted, delete, wait gone."""
        name = self.node.name
        await self.cmd.until_pod(name, uid, mounted, "mounted")
        reply = await self.cmd.request(name, "delete", {"uid": uid})
        assert reply["ok"] or reply["error"]["code"] == "NotFound", reply
        await self.cmd.until_pod(name, uid, gone, "gone")
        self.cycles += 1

    async def cycle(self, uid: str, kind: str) -> None:
        """One pod through its whole life."""
        await self.apply(uid, kind)
        if kind == "blocked":
            await self.unblock(uid)
        await self.finish(uid)

    async def run(self, tag: str, pods: int) -> None:
        """`pods` cycles, the kinds in turn."""
        kinds = list(KINDS)
        for i in range(pods):
            await self.cycle(f"{self.node.name}-{tag}-{i}", kinds[i % len(kinds)])


# ------------------------------------------------------------- aggregator


class AggregatorProcess:
    """`python -m volfsm.cli analytics serve` (the main CLI) with its dashboard on a free port."""

    def __init__(self, db: Path, log: Path, nats_url: str, *extra: str) -> None:
        self.db = db
        self.log = log
        self.port = free_port()
        self.command = [
            sys.executable,
            "-m",
            "volfsm.cli",
            "analytics",
            "serve",
            "--nats",
            nats_url,
            "--db",
            str(db),
            "--http",
            f"127.0.0.1:{self.port}",
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        """The dashboard's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it (output appended to the log file)."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.command,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            )

    def alive(self) -> bool:
        """Whether it runs."""
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash (also the cleanup)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> int:
        """SIGTERM and its exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def report(self) -> dict[str, Any] | None:
        """`/api/report` (None while it does not answer)."""
        status, body = fetch(self.base + "/api/report")
        if status != 200:
            return None
        doc: dict[str, Any] = json.loads(body)
        return doc

    def metrics(self) -> str:
        """`/metrics` text ('' while it does not answer)."""
        status, body = fetch(self.base + "/metrics")
        return body.decode() if status == 200 else ""

    def tail(self, lines: int = 30) -> str:
        """The end of its output."""
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
