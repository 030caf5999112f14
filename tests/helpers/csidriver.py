"""Start, stop and talk to volfsm's CSI driver in tests, and clean up after it.

Usage::

    drv = DriverProcess(tmp_path)          # state dir, faults file, log under tmp_path
    drv.start()                            # waits until Probe answers
    c = drv.clients()                      # c.identity / c.node / c.controller stubs
    ...
    stop_all_drivers(); cleanup_under(tmp_path)
    assert leftovers_under(tmp_path).empty

The driver runs as a subprocess (``python -m volfsm.csidriver``) on a unix
socket in a short private directory (socket paths are limited to 107 bytes).
Everything it mounts or attaches lives under the work directory given, so
``cleanup_under`` can undo it even when a test failed halfway.
``drv.calls(rpc, volume_id)`` / ``drv.codes(rpc)`` read the driver's own call
log. The last section holds the pytest plumbing the CSI suites share (the
janitor fixture, driver fixture and the session's final leftover check).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import pytest

from volfsm.csi.v1 import csi_pb2, csi_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
Mode = csi_pb2.VolumeCapability.AccessMode

_LIVE: set[DriverProcess] = set()
_SOCKET_DIRS: set[Path] = set()


# ---------------------------------------------------------------- requests


def mount_capability(
    mode: csi_pb2.VolumeCapability.AccessMode.Mode = Mode.SINGLE_NODE_WRITER,
    fs_type: str = "ext4",
    mount_flags: Sequence[str] = (),
    volume_mount_group: str = "",
) -> Any:
    """A VolumeCapability for filesystem access."""
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(
            fs_type=fs_type, mount_flags=list(mount_flags), volume_mount_group=volume_mount_group
        ),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=mode),
    )


def block_capability(
    mode: csi_pb2.VolumeCapability.AccessMode.Mode = Mode.SINGLE_NODE_WRITER,
) -> Any:
    """A VolumeCapability for raw block access."""
    return csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=mode),
    )


def create_volume(
    clients: CsiClients, name: str, size: int = 32 * MIB, *, block: bool = False
) -> Any:
    """CreateVolume with one capability; returns the Volume message."""
    cap = block_capability() if block else mount_capability()
    resp = clients.controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(
            name=name,
            capacity_range=csi_pb2.CapacityRange(required_bytes=size),
            volume_capabilities=[cap],
        ),
        timeout=30,
    )
    return resp.volume


def expand_volume(clients: CsiClients, volume_id: str, size: int) -> int:
    """ControllerExpandVolume (the external resizer's part); the new capacity in bytes."""
    resp = clients.controller.ControllerExpandVolume(
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=size)
        ),
        timeout=30,
    )
    return int(resp.capacity_bytes)


def stage_volume(
    clients: CsiClients, volume_id: str, path: str, cap: Any | None = None, timeout: float = 30
) -> Any:
    """NodeStageVolume (filesystem access unless cap says otherwise)."""
    return clients.node.NodeStageVolume(
        csi_pb2.NodeStageVolumeRequest(
            volume_id=volume_id,
            staging_target_path=path,
            volume_capability=cap if cap is not None else mount_capability(),
        ),
        timeout=timeout,
    )


def publish_volume(
    clients: CsiClients,
    volume_id: str,
    staging_path: str,
    target_path: str,
    cap: Any | None = None,
    *,
    readonly: bool = False,
    timeout: float = 30,
) -> Any:
    """NodePublishVolume."""
    return clients.node.NodePublishVolume(
        csi_pb2.NodePublishVolumeRequest(
            volume_id=volume_id,
            staging_target_path=staging_path,
            target_path=target_path,
            volume_capability=cap if cap is not None else mount_capability(),
            readonly=readonly,
        ),
        timeout=timeout,
    )


def unpublish_volume(
    clients: CsiClients, volume_id: str, target_path: str, timeout: float = 30
) -> Any:
    """NodeUnpublishVolume."""
    return clients.node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target_path),
        timeout=timeout,
    )


def unstage_volume(clients: CsiClients, volume_id: str, path: str, timeout: float = 30) -> Any:
    """NodeUnstageVolume."""
    return clients.node.NodeUnstageVolume(
        csi_pb2.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=path),
        timeout=timeout,
    )


# ---------------------------------------------------------------- clients


@dataclass
class CsiClients:
    """gRPC stubs for the three services over one channel."""

    channel: grpc.Channel
    identity: csi_pb2_grpc.IdentityStub
    node: csi_pb2_grpc.NodeStub
    controller: csi_pb2_grpc.ControllerStub

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()


def connect(endpoint: str) -> CsiClients:
    """Stubs for a ``unix:///…sock`` endpoint (kubelet dials with authority localhost)."""
    channel = grpc.insecure_channel(endpoint, options=[("grpc.default_authority", "localhost")])
    return CsiClients(
        channel=channel,
        identity=csi_pb2_grpc.IdentityStub(channel),
        node=csi_pb2_grpc.NodeStub(channel),
        controller=csi_pb2_grpc.ControllerStub(channel),
    )


# ---------------------------------------------------------------- process


@dataclass(eq=False)
class DriverProcess:
    """One volfsm-csi-driver subprocess with its state under workdir."""

    workdir: Path
    node_id: str = "node-1"
    name: str = "csi.volfsm.dev"
    extra_args: Sequence[str] = ()
    proc: subprocess.Popen[bytes] | None = None
    _clients: list[CsiClients] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.state_dir = self.workdir / "driver-state"
        self.faults_file = self.workdir / "driver-faults.json"
        self.log_path = self.workdir / "driver.log"
        self.call_log = self.workdir / "driver-calls.jsonl"
        self.socket_dir = Path(tempfile.mkdtemp(prefix="vcsi-", dir="/tmp"))
        _SOCKET_DIRS.add(self.socket_dir)
        self.socket = self.socket_dir / "csi.sock"

    @property
    def endpoint(self) -> str:
        """The driver's ``unix://`` endpoint."""
        return f"unix://{self.socket}"

    def command(self) -> list[str]:
        """The command line that starts the driver."""
        return [
            sys.executable,
            "-m",
            "volfsm.csidriver",
            "--endpoint",
            self.endpoint,
            "--node-id",
            self.node_id,
            "--state-dir",
            str(self.state_dir),
            "--name",
            self.name,
            "--faults",
            str(self.faults_file),
            "--call-log",
            str(self.call_log),
            "--log-level",
            "DEBUG",
            *self.extra_args,
        ]

    def start(self, timeout: float = 20.0) -> DriverProcess:
        """Start the driver and wait until it answers Probe."""
        if self.alive():
            raise RuntimeError("driver already running")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT
            )
        finally:
            log.close()
        _LIVE.add(self)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Wait for the socket and a successful Probe (raises if the process exits)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"driver exited with {self.returncode()}:\n{self.log_tail()}")
            if self.socket.exists():
                clients = connect(self.endpoint)
                try:
                    clients.identity.Probe(csi_pb2.ProbeRequest(), timeout=2)
                    return
                except grpc.RpcError:
                    pass
                finally:
                    clients.close()
            time.sleep(0.05)
        raise TimeoutError(f"driver not ready after {timeout}s:\n{self.log_tail()}")

    def clients(self) -> CsiClients:
        """New stubs on a new channel (closed by stop())."""
        clients = connect(self.endpoint)
        self._clients.append(clients)
        return clients

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        """Exit code, or None while running (or never started)."""
        return None if self.proc is None else self.proc.poll()

    def wait_exit(self, timeout: float = 10.0) -> int:
        """Wait for the process to end by itself; return its exit code."""
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (then SIGKILL) the driver; close channels. Safe to call twice."""
        for clients in self._clients:
            clients.close()
        self._clients.clear()
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout)
            code = self.proc.returncode
        _LIVE.discard(self)
        return code

    def restart(self, timeout: float = 20.0) -> DriverProcess:
        """Stop (if running) and start again on the same state dir and socket."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop the driver and remove its socket directory."""
        self.stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def set_faults(self, rules: Iterable[dict[str, Any]]) -> None:
        """Replace the fault rules (the driver re-reads them on each call)."""
        tmp = self.faults_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(rules)))
        os.replace(tmp, self.faults_file)

    def clear_faults(self) -> None:
        """No fault rules."""
        self.set_faults([])

    def log_text(self) -> str:
        """Everything the driver logged so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the driver's log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def image(self, volume_id: str) -> Path:
        """The backing file of a volume."""
        return self.state_dir / "volumes" / f"{volume_id}.img"

    def volume_record(self, volume_id: str) -> dict[str, Any]:
        """The driver's own record of a volume (its JSON state file)."""
        data = json.loads((self.state_dir / "volumes" / f"{volume_id}.json").read_text())
        assert isinstance(data, dict)
        return data

    def calls(
        self, rpc: str | None = None, volume_id: str | None = None, *, event: str = "end"
    ) -> list[dict[str, Any]]:
        """The driver's own record of its calls (``--call-log``), oldest first.

        `event` "end" gives answered calls (with their ``code``), "start" every
        call that arrived (also the ones that crashed the driver).
        """
        if not self.call_log.exists():
            return []
        found = []
        for line in self.call_log.read_text().splitlines():
            if not line.strip():
                continue
            entry = json.loads(line)
            if entry.get("event") != event:
                continue
            if rpc is not None and entry.get("rpc") != rpc:
                continue
            if volume_id is not None and entry.get("volume_id") != volume_id:
                continue
            found.append(entry)
        return found

    def codes(self, rpc: str, volume_id: str | None = None) -> list[str]:
        """The codes the driver answered `rpc` with ("OK", "ABORTED", ...), oldest first."""
        return [str(e["code"]) for e in self.calls(rpc, volume_id)]


def stop_all_drivers() -> None:
    """Stop every driver started through this module that is still registered."""
    for drv in list(_LIVE):
        drv.close()


def live_drivers() -> list[DriverProcess]:
    """Drivers started through this module and not stopped yet."""
    return [d for d in _LIVE if d.alive()]


# ---------------------------------------------------------------- system state


@dataclass(frozen=True)
class Mount:
    """A mount point and its source, from /proc/self/mountinfo."""

    mount_point: str
    root: str
    fstype: str
    source: str
    options: tuple[str, ...]


def mountinfo() -> list[Mount]:
    """Mounts of this process's namespace."""
    result = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.rstrip("\n").partition(" - ")
            fields = left.split(" ")
            tail = right.split(" ")
            result.append(
                Mount(
                    mount_point=_unescape(fields[4]),
                    root=_unescape(fields[3]),
                    fstype=tail[0],
                    source=tail[1] if len(tail) > 1 else "",
                    options=tuple(fields[5].split(",")),
                )
            )
    return result


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mounts_at(path: str | Path) -> list[Mount]:
    """Mounts at exactly this path."""
    want = os.path.realpath(path)
    return [m for m in mountinfo() if m.mount_point == want]


def loop_devices() -> list[tuple[str, str]]:
    """(device, backing file) of every attached loop device."""
    out = subprocess.run(
        ["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = []
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            result.append((parts[0], parts[1].removesuffix(" (deleted)").strip()))
    return result


def loops_of(backing: str | Path) -> list[str]:
    """Loop devices of a backing file, as ``losetup -j`` reports them."""
    out = subprocess.run(
        ["losetup", "--noheadings", "--output", "NAME", "--associated", str(backing)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def driver_pids_under(root: str | Path) -> list[int]:
    """Running CSI driver processes whose --state-dir is under root."""
    base = os.path.realpath(root)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "volfsm.csidriver" not in argv and not any(
            a.endswith("volfsm-csi-driver") for a in argv
        ):
            continue
        for flag, value in itertools.pairwise(argv):
            if flag == "--state-dir" and _under(os.path.realpath(value), base):
                pids.append(int(entry.name))
    return pids


@dataclass
class Leftovers:
    """Driver processes, mounts and loop devices left under a directory."""

    mounts: list[str]
    loops: list[tuple[str, str]]
    pids: list[int] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Whether nothing is left."""
        return not self.mounts and not self.loops and not self.pids


def leftovers_under(root: str | Path) -> Leftovers:
    """Drivers with state under root, mounts under root, loop devices backed under root."""
    base = os.path.realpath(root)
    return Leftovers(
        mounts=[m.mount_point for m in mountinfo() if _under(m.mount_point, base)],
        loops=[(dev, back) for dev, back in loop_devices() if _under(back, base)],
        pids=driver_pids_under(base),
    )


def _end_process(pid: int, timeout: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or _is_zombie(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def _detach_loops_under(root: str | Path) -> None:
    for dev, _ in leftovers_under(root).loops:
        subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)


def _unmount_under(root: str | Path) -> None:
    base = os.path.realpath(root)
    points = {m.mount_point for m in mountinfo() if _under(m.mount_point, base)}
    for point in sorted(points, key=lambda p: p.count("/"), reverse=True):
        while mounts_at(point):
            done = subprocess.run(["umount", point], capture_output=True, check=False)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
                if mounts_at(point):
                    break


def cleanup_under(root: str | Path, timeout: float = 10.0) -> Leftovers:
    """End drivers with state under root, unmount everything under root (deepest
    first) and detach loop devices backed by files under root.

    Returns what was found before cleaning. Loop devices are detached before
    and after the unmounts: a block volume's lock loop device is backed by a
    file under root with the volume's device bind-mounted on it, and a busy
    loop device is only marked to go when its last user closes it, so the
    pass repeats (for up to `timeout` seconds) until nothing is left. Falls
    back to a lazy unmount for a busy mount, so that one stuck test does not
    poison the rest of the run.
    """
    found = leftovers_under(root)
    for drv in list(_LIVE):
        if _under(os.path.realpath(drv.workdir), os.path.realpath(root)):
            drv.close()
    for pid in driver_pids_under(root):
        _end_process(pid)
    deadline = time.monotonic() + timeout
    while True:
        _detach_loops_under(root)
        _unmount_under(root)
        _detach_loops_under(root)
        if leftovers_under(root).empty or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


# ---------------------------------------------------------------- pytest plumbing
#
# The CSI suites (tests/csidriver, tests/csiplugin, tests/enginecsi) share
# these. A conftest binds them to its own names, which pytest picks up:
#
#     pytest_runtest_makereport = remember_reports
#     _nothing_left_behind = nothing_left_behind
#     janitor = janitor_fixture
#     start_driver = start_driver_fixture

StartDriver = Callable[..., DriverProcess]
_REPORTS = "_csi_reports"


class Closeable(Protocol):
    """Anything a test registers with the janitor (drivers, servers, engines' stacks)."""

    def close(self) -> None:
        """Stop it and release what it holds."""


@pytest.hookimpl(wrapper=True, tryfirst=True)
def remember_reports(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Hook body for ``pytest_runtest_makereport``: keep each phase's report on the item."""
    report = yield
    reports = getattr(item, _REPORTS, None)
    if reports is None:
        reports = {}
        setattr(item, _REPORTS, reports)
    reports[report.when] = report
    return report


def call_passed(item: pytest.Item) -> bool:
    """Whether the test body ran and passed (needs `remember_reports`)."""
    report = getattr(item, _REPORTS, {}).get("call")
    return report is not None and bool(report.passed)


def check_clean(item: pytest.Item, root: Path) -> None:
    """Clean up under root; fail if that failed, or if a passing test left anything."""
    found = cleanup_under(root)
    left = leftovers_under(root)
    assert left.empty, f"cleanup failed under {root}: {left}"
    if call_passed(item):
        assert found.empty, f"the test left mounts, loop devices or drivers behind: {found}"


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Final check of the session: no driver process, mount or loop device is left.

    Scoped to this session's base temp dir (and the drivers this process
    started): other suites may be running on the machine at the same time.
    """
    yield
    base = tmp_path_factory.getbasetemp()
    stray = live_drivers()
    stop_all_drivers()
    found = cleanup_under(base)
    sockets = [d for d in _SOCKET_DIRS if d.exists()]
    assert not stray, f"driver processes left running: {stray}"
    assert found.empty, f"left behind under {base}: {found}"
    assert leftovers_under(base).empty
    assert not sockets, f"driver socket dirs left behind: {sockets}"


@pytest.fixture
def janitor_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[Closeable]]:
    """Closes what tests register (last first), then cleans tmp_path (see `check_clean`)."""
    things: list[Closeable] = []
    try:
        yield things
    finally:
        try:
            for thing in reversed(things):
                thing.close()
        finally:
            check_clean(request.node, tmp_path)


@pytest.fixture
def start_driver_fixture(janitor: list[Closeable], tmp_path: Path) -> StartDriver:
    """Start volfsm's CSI driver: extra command-line flags as arguments, DriverProcess
    fields as keywords (state under `workdir`, default tmp_path)."""

    def start(*extra_args: str, workdir: Path | None = None, **kwargs: Any) -> DriverProcess:
        drv = DriverProcess(workdir or tmp_path, extra_args=extra_args, **kwargs)
        janitor.append(drv)
        return drv.start()

    return start
