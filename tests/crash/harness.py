"""One crash-tested node: `volfsm serve` killed at fault points and restarted on the same dirs.

`CrashNode` keeps the node's desired state as the test (the "API server")
sees it: pods applied and not deleted are desired, deleted ones must end up
cleaned. After every restart `resync()` sends it all again (apply is
idempotent, a second delete answers NotFound), as the kubelet re-lists the
API server; a command the crash interrupted is thereby not lost.

`converge()` polls the service and the node until

* every desired pod is Mounted, with its mounts (ext4 on the driver's loop
  device, tmpfs) and block device links really there;
* every deleted pod is gone: no pod directory, no mount, no loop device,
  and its CSI volumes unstaged (no staging or global map directory, no loop
  device on the driver's image);
* no other mount or loop device exists under the node's root dir;
* the relay has published everything (`publish_lag` 0);

and then checks that `volfsm validate` accepts the log, that no volume of a
pod desired all along was ever unmounted or unstaged (a restart must not
disturb running pods), and that the JetStream stream holds the log's events
exactly (same seqs and bodies, in order, no duplicates).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from events.streams import device_stream, podvol_stream
from tests.crash.workload import DRIVER, OBJECT_KEY, Pod, Volume
from tests.helpers.csidriver import (
    MIB,
    DriverProcess,
    create_volume,
    loop_devices,
    mountinfo,
)
from tests.service.helpers import ServeProcess, expected_stream, read_stream
from volfsm.cli import app
from volfsm.node.atomicwriter import TS_DIR_RE, read_payload
from volfsm.node.layout import RootLayout
from volfsm.service.client import CommandFailedError, ServiceClient, ServiceUnreachableError, Target

FAULT_LINE = "volfsm: fault point "
COMMAND_TIMEOUT_S = 5.0
CONVERGE_TIMEOUT_S = float(os.environ.get("VOLFSM_CRASH_CONVERGE_S", "45"))
"""Seconds a node may take to converge (a normal convergence takes one or two)."""
READY_TIMEOUT_S = 60.0
EXIT_WAIT_S = 5.0
VOLUME_BYTES = 32 * MIB
DESIRED_GRACE_S = 0.3
"""Grace the restarted service waits for the desired state before unmounting."""


class CrashTestError(AssertionError):
    """The node did not behave: did not crash where armed, did not converge, lost events."""


@dataclass
class Crash:
    """One SIGKILL at a fault point."""

    spec: str
    line: str
    """What the service wrote just before it (names the point and qualifiers hit)."""

    @property
    def pod(self) -> str:
        """Uid of the pod whose operation was killed ('' if none)."""
        m = re.search(r"\[pod=(\S+) ", self.line)
        return m[1] if m and m[1] != "-" else ""


@dataclass
class Start:
    """One run of the service."""

    n: int
    fault: str | None
    stderr: Path
    crash: Crash | None = None
    ready_s: float | None = None
    """Seconds from spawning the process to ready (None if it crashed first)."""


@dataclass
class CrashNode:
    """A node under crash test; see the module docstring."""

    workdir: Path
    nats_url: str
    driver: DriverProcess
    node: str
    extra_args: list[str] = field(default_factory=list)
    desired: dict[str, Pod] = field(default_factory=dict)
    deleted: dict[str, Pod] = field(default_factory=dict)
    starts: list[Start] = field(default_factory=list)
    _volumes: int = 0

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = ["--csi", f"{DRIVER}={self.driver.endpoint}", "--drain-grace", "5"]
        args += ["--desired-grace", str(DESIRED_GRACE_S)]
        self._serve_args = [*args, *self.extra_args]
        self.serve = ServeProcess(
            self.workdir, node=self.node, nats_url=self.nats_url, args=self._serve_args
        )
        self.layout = RootLayout(self.serve.root_dir)
        self.target = Target(url=self.nats_url, node=self.node)

    # ------------------------------------------------------------ workload

    def new_volume(self, kind: str) -> Volume:
        """A fresh volume of `kind` (CSI ones are created in the driver now)."""
        self._volumes += 1
        name = f"v{self._volumes}"
        if kind not in ("fs", "block"):
            return Volume(kind, name)
        handle = f"{self.node}-{name}"
        clients = self.driver.clients()
        try:
            create_volume(clients, handle, VOLUME_BYTES, block=kind == "block")
        finally:
            clients.close()
        return Volume(kind, name, handle)

    def new_pod(self, name: str, kinds: Iterable[str]) -> Pod:
        """A pod named `name` with one fresh volume per kind."""
        uid = f"{self.node}-{name}-uid"
        return Pod(uid, name, [self.new_volume(k) for k in kinds])

    def images(self) -> dict[Path, Volume]:
        """The driver's backing file of every CSI volume this node created."""
        out = {}
        for pod in (*self.desired.values(), *self.deleted.values()):
            for vol in pod.volumes:
                if vol.csi:
                    out[self.driver.image(vol.handle)] = vol
        return out

    # ------------------------------------------------------------ process

    @property
    def alive(self) -> bool:
        """Whether the service runs."""
        return self.serve.alive()

    @property
    def crashes(self) -> list[Crash]:
        """Every crash so far, in order."""
        return [s.crash for s in self.starts if s.crash is not None]

    def start(self, fault: str | None = None, *, timeout: float = READY_TIMEOUT_S) -> bool:
        """Start the service (armed with `fault`); True once ready, False if it crashed first."""
        if self.alive:
            raise CrashTestError("the service is already running")
        start = Start(
            len(self.starts) + 1, fault, self.workdir / f"serve-{len(self.starts) + 1}.log"
        )
        self.starts.append(start)
        self.serve.stderr_path = start.stderr
        fault_args = ["--fault-point", fault] if fault else []
        self.serve.args = [*self._serve_args, *fault_args]
        began = time.monotonic()
        self.serve.start(wait_ready=False)
        deadline = began + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                self._note_exit()
                return False
            status, _ = self.serve.http_get("/readyz")
            if status == 200 and "taking commands" in self.serve.stderr_text():
                start.ready_s = time.monotonic() - began
                return True
            time.sleep(0.05)
        raise CrashTestError(f"start {start.n}: not ready after {timeout:g}s\n{self.diagnostics()}")

    def _note_exit(self) -> Crash:
        """The service exited: it must have been our SIGKILL; record it."""
        proc = self.serve.proc
        assert proc is not None
        code = proc.wait()
        start = self.starts[-1]
        lines = [ln for ln in self.serve.stderr_text().splitlines() if ln.startswith(FAULT_LINE)]
        if code != -signal.SIGKILL or not lines or start.fault is None:
            raise CrashTestError(
                f"start {start.n} (fault {start.fault}) exited with {code}, not by its fault "
                f"point\n{self.diagnostics()}"
            )
        point = re.split(r"[/@+]", start.fault, maxsplit=1)[0]
        if not lines[-1].startswith(f"{FAULT_LINE}{point} "):
            raise CrashTestError(f"armed {start.fault}, but it died at: {lines[-1]}")
        start.crash = Crash(start.fault, lines[-1])
        return start.crash

    def wait_crash(self, timeout: float = 60.0) -> Crash | None:
        """Wait for the armed service to kill itself; None if it still runs after `timeout`."""
        proc = self.serve.proc
        assert proc is not None
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._note_exit()

    def stop(self) -> int:
        """SIGTERM (a clean drain); the exit code."""
        return self.serve.stop()

    def kill(self) -> None:
        """SIGKILL from outside (cleanup)."""
        self.serve.kill()

    # ------------------------------------------------------------ commands

    def request(self, verb: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """One command; None if the service died (or stopped answering) meanwhile."""

        async def send() -> dict[str, Any] | None:
            async with ServiceClient(self.target, timeout=COMMAND_TIMEOUT_S) as client:
                asking = asyncio.ensure_future(client.request(verb, body))
                while not asking.done():  # do not sit out the timeout when it dies meanwhile
                    await asyncio.wait({asking}, timeout=0.05)
                    if not asking.done() and not self.alive:
                        asking.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await asking
                        return None
                return asking.result()

        try:
            return asyncio.run(send())
        except ServiceUnreachableError:
            proc = self.serve.proc
            assert proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(EXIT_WAIT_S)  # its connection dies before the process is reaped
            if self.alive:
                raise
            return None

    def apply(self, *pods: Pod) -> bool:
        """Make `pods` desired; False if the service died before answering."""
        objects = []
        for pod in pods:
            self.desired[pod.uid] = pod
            self.deleted.pop(pod.uid, None)
            objects.extend(pod.objects())
        return self.request("apply", {"objects": objects}) is not None

    def delete(self, uid: str) -> bool:
        """Delete a desired pod; False if the service died before answering."""
        self.deleted[uid] = self.desired.pop(uid)
        return self._delete(uid)

    def _delete(self, uid: str) -> bool:
        try:
            return self.request("delete", {"uid": uid}) is not None
        except CommandFailedError as exc:
            if exc.code != "NotFound":
                raise
            return True

    def forget(self, uid: str) -> None:
        """Delete a pod while the service is down (it learns of it on `resync`)."""
        self.deleted[uid] = self.desired.pop(uid)

    def resync(self) -> bool:
        """Tell a (re)started service the whole desired state again; False if it died."""
        if self.desired:
            objects = [o for pod in self.desired.values() for o in pod.objects()]
            if self.request("apply", {"objects": objects}) is None:
                return False
        return all(self._delete(uid) for uid in list(self.deleted))

    def get(self, what: str) -> dict[str, Any]:
        """`get pods` / `get volumes` reply."""
        reply = self.request("get", {"what": what})
        if reply is None:
            raise CrashTestError(f"the service died during `get {what}`\n{self.diagnostics()}")
        return reply

    # ------------------------------------------------------------ convergence

    def problems(self) -> list[str]:
        """Everything that still differs from the converged state (empty: converged)."""
        pods = self.get("pods")
        volumes = self.get("volumes")
        out = self._service_problems(pods, volumes)
        out += self._node_problems()
        if pods.get("publish_lag") != 0:
            out.append(f"relay: publish lag {pods.get('publish_lag')} ({pods.get('relay')})")
        return out

    def _service_problems(self, pods: dict[str, Any], volumes: dict[str, Any]) -> list[str]:
        out = []
        by_uid = {p["uid"]: p for p in pods["items"]}
        for uid in self.desired:
            item = by_uid.get(uid)
            if item is None or item["phase"] != "Mounted":
                vols = [(v["name"], v["state"]) for v in (item or {}).get("volumes", [])]
                out.append(f"pod {uid}: {item and item['phase']} {vols}, want Mounted")
        for uid in self.deleted:
            item = by_uid.get(uid)
            if item is not None and item["phase"] != "Gone":
                vols = [(v["name"], v["state"]) for v in item.get("volumes", [])]
                out.append(f"deleted pod {uid}: {item['phase']} {vols}, want Gone")
        by_id = {v["volume_id"]: v for v in volumes["items"]}
        for pod in self.deleted.values():
            for vol in pod.volumes:
                item = by_id.get(vol.volume_id) if vol.csi else None
                if item is not None and item["state"] != "Detached":
                    out.append(f"volume {vol.handle} of deleted pod: {item['state']}")
        return out

    def _node_problems(self) -> list[str]:
        out = []
        root = os.path.realpath(self.serve.root_dir)
        mounts = [m for m in mountinfo() if m.mount_point.startswith(root + "/")]
        images = self.images()
        loops = [
            (dev, back)
            for dev, back in loop_devices()
            if back.startswith(root + "/") or Path(back) in images
        ]
        wanted: set[str] = set()
        for pod in self.desired.values():
            wanted.add(pod.uid)
            for vol in pod.volumes:
                wanted |= vol.tokens(self.layout)
                out += self._desired_volume_problems(pod, vol, mounts)
        gone: set[str] = set()
        for pod in self.deleted.values():
            gone.add(pod.uid)
            if os.path.lexists(self.layout.pod_dir(pod.uid)):
                out.append(f"deleted pod {pod.uid}: {self.layout.pod_dir(pod.uid)} still exists")
            for vol in pod.volumes:
                gone |= vol.tokens(self.layout)
                out += [
                    f"deleted pod's volume dir left: {d}"
                    for d in vol.device_dirs(self.layout)
                    if os.path.lexists(d)
                ]
        for m in mounts:
            parts = set(m.mount_point[len(root) + 1 :].split("/"))
            if parts & gone or not parts & wanted:
                out.append(f"mount left: {m.mount_point} ({m.fstype} {m.source})")
        for dev, back in loops:
            image_of = images.get(Path(back))
            if image_of is not None:
                owner = {image_of.handle} | image_of.tokens(self.layout)
            else:
                owner = set(back[len(root) + 1 :].split("/"))
            if owner & gone or not owner & wanted:
                out.append(f"loop device left: {dev} on {back}")
        return out

    def _desired_volume_problems(self, pod: Pod, vol: Volume, mounts: list[Any]) -> list[str]:
        path = vol.pod_path(self.layout, pod.uid)
        here = [m for m in mounts if m.mount_point == str(path)]
        if vol.kind == "fs" and [m.fstype for m in here] != ["ext4"]:
            return [f"pod {pod.uid} volume {vol.name}: mounts at {path}: {here}"]
        if vol.kind == "tmpfs" and [m.fstype for m in here] != ["tmpfs"]:
            return [f"pod {pod.uid} volume {vol.name}: mounts at {path}: {here}"]
        if vol.kind == "emptydir" and (here or not path.is_dir()):
            return [f"pod {pod.uid} volume {vol.name}: {path} is not a plain directory"]
        if vol.kind in ("configmap", "secret"):
            return _object_volume_problems(pod, vol, path, [m.fstype for m in here])
        if vol.kind == "block":
            try:
                mode = os.stat(path).st_mode
            except OSError as exc:
                return [f"pod {pod.uid} volume {vol.name}: device link {path}: {exc}"]
            if not stat.S_ISBLK(mode):
                return [f"pod {pod.uid} volume {vol.name}: {path} is not a block device"]
        return []

    def settle(self, timeout: float = CONVERGE_TIMEOUT_S) -> bool:
        """Wait until converged (True) or the armed service crashed (False)."""
        deadline = time.monotonic() + timeout
        problems: list[str] = []
        while time.monotonic() < deadline:
            if not self.alive:
                self._note_exit()
                return False
            try:
                problems = self.problems()
            except CrashTestError:
                if self.alive:
                    raise
                continue
            if not problems:
                return True
            time.sleep(0.1)
        shown = "\n  ".join(problems)
        raise CrashTestError(f"not converged after {timeout:g}s:\n  {shown}\n{self.diagnostics()}")

    def converge(self, timeout: float = CONVERGE_TIMEOUT_S) -> None:
        """Wait until `problems()` is empty, then check the log and the stream."""
        if not self.settle(timeout):
            raise CrashTestError(
                f"the armed service crashed while converging\n{self.diagnostics()}"
            )
        self.check_log_and_stream()

    def check_log_and_stream(self) -> None:
        """`volfsm validate` passes; the stream holds exactly the log's events, in order."""
        db = self.serve.data_dir / "volfsm.db"
        result = CliRunner().invoke(app, ["validate", "--db", str(db), "-o", "json"])
        if result.exit_code != 0:
            raise CrashTestError(f"volfsm validate failed:\n{result.output}\n{self.diagnostics()}")
        self.check_desired_never_unmounted()
        for _ in range(50):
            # The stream first, then the log: the service is running (its stats gatherer
            # appends while we look), and the relay only publishes what is logged, so the log
            # read second holds everything the stream does; a longer stream is a real fault.
            have = read_stream(self.nats_url, self.node)
            log = self.serve.open_log()
            try:
                want = expected_stream(log, self.node)
            finally:
                log.close()
            if have == want:
                return
            if len(have) < len(want) and have == want[: len(have)]:
                time.sleep(0.1)  # the relay is publishing what was just appended
                continue
            break
        have_ids = [e.msg_id for e in have]
        want_ids = [e.msg_id for e in want]
        dups = sorted({i for i in have_ids if have_ids.count(i) > 1})
        first = next((i for i, (a, b) in enumerate(zip(have, want, strict=False)) if a != b), None)
        missing = sorted(set(want_ids) - set(have_ids))[:5]
        raise CrashTestError(
            f"stream != log: {len(have)} in stream, {len(want)} in log; duplicates {dups[:5]}; "
            f"first difference at index {first}; missing {missing}\n{self.diagnostics()}"
        )

    def check_desired_never_unmounted(self) -> None:
        """No restart unmounted or unstaged a volume of a pod that was desired all along."""
        watched: dict[str, str] = {}
        for pod in self.desired.values():
            for vol in pod.volumes:
                watched[podvol_stream(pod.uid, vol.name)] = pod.uid
                if vol.csi:
                    watched[device_stream(vol.volume_id)] = pod.uid
        log = self.serve.open_log()
        try:
            bad = [
                f"{env.seq} {env.type} {env.stream}"
                for env in log.read_after(0)
                if env.stream in watched and env.type in ("VolumeUnmounted", "DeviceUnmounted")
            ]
        finally:
            log.close()
        if bad:
            raise CrashTestError(
                "volumes of pods desired all along were unmounted:\n  "
                + "\n  ".join(bad)
                + f"\n{self.diagnostics()}"
            )

    # ------------------------------------------------------------ reporting

    def story(self, last: int = 60) -> str:
        """The log's last events, a line each (seq, type, stream, operation, code, reason).

        Retries that repeat (the same started/failed pair again and again) are
        folded into one line with a count, so the story before them shows.
        """
        try:
            log = self.serve.open_log()
        except Exception as exc:
            return f"(no log: {exc})"
        try:
            envs = list(log.read_after(0))
        finally:
            log.close()
        rows: list[tuple[int, str]] = []
        for env in envs:
            body = env.body
            extra = " ".join(
                f"{k}={getattr(body, k)}"
                for k in ("operation", "code", "reason")
                if getattr(body, k, "")
            )
            rows.append((env.seq, f"{env.type:22s} {env.stream} {extra}"))
        out: list[str] = []
        i = 0
        while i < len(rows):
            seq, text = rows[i]
            pair = [t for _, t in rows[i : i + 2]]
            repeats = 1
            while (
                len(pair) == 2
                and [t for _, t in rows[i + 2 * repeats : i + 2 * repeats + 2]] == pair
            ):
                repeats += 1
            if repeats > 2:
                last_seq = rows[i + 2 * repeats - 1][0]
                out.append(
                    f"  {seq:5d}..{last_seq} x{repeats}: {pair[0]} / {pair[1].split(' ')[0]}"
                )
                i += 2 * repeats
                continue
            out.append(f"  {seq:5d} {text}")
            i += 1
        return "\n".join(out[-last:])

    def log_excerpt(self, lines: int = 12) -> str:
        """The last start's last service log lines, as `time level message`."""
        out = []
        for line in self.serve.stderr_text().splitlines()[-lines:]:
            try:
                item = json.loads(line)
                out.append(f"  {item['time'][11:23]} {item['level']:7s} {item['message'][:300]}")
            except (ValueError, KeyError, TypeError):
                out.append(f"  {line[:300]}")
        return "\n".join(out)

    def diagnostics(self) -> str:
        """Starts and crashes, the last service log lines, the log's last events."""
        starts = "\n".join(
            f"  start {s.n}: fault {s.fault or '-'}: {s.crash.line if s.crash else 'no crash'}"
            for s in self.starts
        )
        tail = self.log_excerpt() if self.starts else ""
        return (
            f"node {self.node} ({self.workdir})\n{starts}\n--- service log (last start) ---\n"
            f"{tail}\n--- event log ---\n{self.story()}"
        )


def cleanup_node(node: CrashNode, sleep: Callable[[float], None] = time.sleep) -> None:
    """Kill the service, then undo what it and the driver left under its root, in order.

    Block volumes first lose their fd-lock loop devices (backed by the global
    map files under the root), so that the bind mounts under them can be
    unmounted for real: a lazy unmount there would keep the driver's loop
    device busy for good. Then every mount goes (deepest first), then the
    loop devices on this node's driver images.
    """
    node.kill()
    root = os.path.realpath(node.serve.root_dir)
    images = {str(p) for p in node.images()}

    def detach(match: Callable[[str], bool]) -> None:
        for dev, back in loop_devices():
            if match(back):
                subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)

    for attempt in range(5):
        detach(lambda back: back.startswith(root + "/"))
        for dev in locks_on([dev for dev, back in loop_devices() if back in images]):
            subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)
        found = sorted(
            (m.mount_point for m in mountinfo() if m.mount_point.startswith(root + "/")),
            key=lambda p: p.count("/"),
            reverse=True,
        )
        for point in found:
            done = subprocess.run(["umount", point], capture_output=True, check=False)
            if done.returncode != 0 and attempt == 4:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        detach(lambda back: back in images)
        if not found:
            return
        sleep(0.2)


def locks_on(devices: list[str]) -> list[str]:
    """Loop devices whose backing file is one of `devices` through its /dev node.

    That is a block volume's fd lock whose global map bind mount is gone
    (lazily unmounted): losetup shows its backing file as "/", only the
    inode still names the device it holds open.
    """
    inodes: dict[tuple[str, int], str] = {}
    for dev in devices:
        with contextlib.suppress(OSError):
            st = os.stat(dev)
            inodes[(f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", st.st_ino)] = dev
    if not inodes:
        return []
    out = subprocess.run(
        ["losetup", "--list", "--noheadings", "--output", "NAME,BACK-INO,BACK-MAJ:MIN"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    locks = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and (parts[2], int(parts[1])) in inodes:
            locks.append(parts[0])
    return locks


def _object_volume_problems(pod: Pod, vol: Volume, path: Path, fstypes: list[str]) -> list[str]:
    """A configmap / secret volume: its tmpfs (secret only), its one file, one timestamped dir."""
    where = f"pod {pod.uid} volume {vol.name}"
    if fstypes != (["tmpfs"] if vol.kind == "secret" else []):
        return [f"{where}: mounts at {path}: {fstypes}"]
    try:
        files = read_payload(path)
        stamped = [n for n in os.listdir(path) if TS_DIR_RE.match(n)]
    except OSError as exc:
        return [f"{where}: {path}: {exc}"]
    if files != {OBJECT_KEY: vol.content} or len(stamped) != 1:
        return [f"{where}: {path} holds {sorted(files)} in {stamped}"]
    return []
