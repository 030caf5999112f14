"""A volume plugin for tests: every call follows a script of outcomes.

`ScriptedPlugin` poses as a CSI driver (source plugin "kubernetes.io/csi"
and a driver name) and can be configured attachable, device-mountable,
block-capable and expandable. Given another `plugin_name` it is a plugin of
its own instead (registered with `PluginCatalog.register`): filesystem
volumes only, at ``pods/<uid>/volumes/<plugin~>/<name>`` and, when
device-mountable, ``plugins/<plugin>/<sha256(handle)>/globalmount``; each
volume's spec is written to a ``scripted.json`` of its own (in
``pods/<uid>/plugins/<plugin~>/<name>/`` and the global dir), and its
reconstruction hooks read it back. That is the whole of what a new volume
type needs for reconstruction: the engine has no code for it.

Each method has a queue of scripted outcomes, optionally per volume; an
empty queue means "ok". Outcomes:

* `ok()` - succeed (optionally with a value: the device path of
  `wait_for_attach`, the size `expand` reports, `device_still_open`'s answer);
* `final(code)` - a final error (the driver answered; nothing is in flight);
* `nonfinal(code)` - a non-final error (the call may still be in progress);
* `transient(code)` - failed before the driver was reached;
* `timeout()` - sleeps past the executor's timeout (then reports
  DeadlineExceeded itself if nobody cancelled it);
* `hang()` - waits until cancelled.

Any outcome can first wait `delay` seconds or for a `gate` (an
`asyncio.Event` the test sets). Calls are counted (`counts`) and logged
(`call_log`). Successful calls create and remove the directories they
"mount" under the root (no real mounts); block volumes get a real loop
device over a small sparse file, so that the engine's block mapping works
on a genuine block device. `cleanup()` detaches every loop device the
plugin made.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

from events.types import DesiredVolume, VolumeSource
from volfsm.node.dirsonly import remove_dirs
from volfsm.node.layout import (
    CSI_PLUGIN,
    GLOBAL_MOUNT,
    RootLayout,
    UnsafePathError,
    volume_handle_dir_name,
)
from volfsm.plugins.base import (
    BLOCK,
    ConstructedSpec,
    ErrorClass,
    GlobalDir,
    GlobalScan,
    MountResult,
    NodeView,
    PluginError,
    PodVolumeDir,
    VolumePlugin,
    VolumeRequest,
    list_dir,
)
from volfsm.plugins.csi.files import read_json, remove_file, write_json

METHODS = (
    "wait_for_attach",
    "mount_device",
    "unmount_device",
    "device_still_open",
    "set_up",
    "tear_down",
    "expand",
)
"""The plugin methods that can be scripted."""

_BLOCK_FILE_BYTES = 1 << 20
RECORD = "scripted.json"
"""Where a plugin of its own (not posing as CSI) writes each volume's spec."""


@dataclass(frozen=True)
class Outcome:
    """What one scripted call does."""

    kind: str = "ok"
    code: str = ""
    message: str = ""
    delay: float = 0.0
    gate: asyncio.Event | None = None
    value: object = None


def ok(value: object = None, *, delay: float = 0.0, gate: asyncio.Event | None = None) -> Outcome:
    """Succeed (after `delay` / `gate`), returning `value` where the method returns one."""
    return Outcome("ok", delay=delay, gate=gate, value=value)


def final(
    code: str = "Internal",
    message: str = "scripted final error",
    *,
    delay: float = 0.0,
    gate: asyncio.Event | None = None,
) -> Outcome:
    """Fail with a final error: the driver answered, nothing is in progress."""
    return Outcome("final", code, message, delay=delay, gate=gate)


def nonfinal(
    code: str = "Unavailable",
    message: str = "scripted non-final error",
    *,
    delay: float = 0.0,
    gate: asyncio.Event | None = None,
) -> Outcome:
    """Fail with a non-final error: the call may still be in progress."""
    return Outcome("nonfinal", code, message, delay=delay, gate=gate)


def transient(
    code: str = "NotReady",
    message: str = "scripted error before the driver",
    *,
    delay: float = 0.0,
    gate: asyncio.Event | None = None,
) -> Outcome:
    """Fail before the driver was reached: nothing changed."""
    return Outcome("transient", code, message, delay=delay, gate=gate)


def timeout() -> Outcome:
    """Sleep past the executor's timeout."""
    return Outcome("timeout", "DeadlineExceeded", "scripted timeout")


def hang(gate: asyncio.Event | None = None) -> Outcome:
    """Wait until cancelled (or until `gate` is set, then succeed)."""
    return Outcome("hang", gate=gate)


@dataclass(frozen=True)
class Call:
    """One call the plugin received and the outcome it followed."""

    method: str
    volume_id: str
    pod_uid: str
    outcome: str


@dataclass
class _BlockDevice:
    backing: Path
    loop: str


@dataclass(eq=False)
class ScriptedPlugin(VolumePlugin):
    """A CSI-looking plugin whose calls follow scripted outcomes (see the module doc)."""

    driver: str = "scripted.volfsm.io"
    plugin_name: str = CSI_PLUGIN
    """Another name makes it a plugin of its own (see the module doc)."""
    attachable: bool = False
    device_mountable: bool = False
    block: bool = False
    expandable: bool = False
    timeout_sleep: float = 3600.0
    counts: Counter[str] = field(default_factory=Counter, init=False)
    call_log: list[Call] = field(default_factory=list, init=False, repr=False)
    _queues: dict[tuple[str, str | None], deque[Outcome]] = field(
        default_factory=dict, init=False, repr=False
    )
    _layout: RootLayout | None = field(default=None, init=False, repr=False)
    _devices: dict[str, _BlockDevice] = field(default_factory=dict, init=False, repr=False)

    name = CSI_PLUGIN

    def __post_init__(self) -> None:
        self.name = self.plugin_name

    @property
    def own(self) -> bool:
        """Whether it is a plugin of its own rather than a CSI driver look-alike."""
        return self.name != CSI_PLUGIN

    # ------------------------------------------------------------- scripting

    def script(self, method: str, *outcomes: Outcome, volume_id: str | None = None) -> None:
        """Queue outcomes for `method` (for one volume only if `volume_id` is given)."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
        self._queues.setdefault((method, volume_id), deque()).extend(outcomes)

    def pending_outcomes(self, method: str, volume_id: str | None = None) -> int:
        """Scripted outcomes not used yet."""
        return len(self._queues.get((method, volume_id), ()))

    def calls(self, method: str, volume_id: str | None = None, pod_uid: str | None = None) -> int:
        """How many calls of `method` were made (optionally for one volume / pod)."""
        if volume_id is None and pod_uid is None:
            return self.counts[method]
        return sum(
            1
            for c in self.call_log
            if c.method == method
            and (volume_id is None or c.volume_id == volume_id)
            and (pod_uid is None or c.pod_uid == pod_uid)
        )

    def methods_called(self) -> list[str]:
        """The methods called, in order."""
        return [c.method for c in self.call_log]

    def _take(self, method: str, volume_id: str) -> Outcome:
        for key in ((method, volume_id), (method, None)):
            queue = self._queues.get(key)
            if queue:
                return queue.popleft()
        return Outcome()

    async def _follow(self, method: str, req: VolumeRequest) -> Outcome:
        """Count the call, wait as scripted, raise for error outcomes; the outcome if ok."""
        outcome = self._take(method, req.volume_id)
        self.counts[method] += 1
        self.call_log.append(Call(method, req.volume_id, req.pod_uid, outcome.kind))
        if outcome.delay:
            await asyncio.sleep(outcome.delay)
        if outcome.kind == "hang":
            if outcome.gate is None:
                await asyncio.Event().wait()
            else:
                await outcome.gate.wait()
            return Outcome()
        if outcome.gate is not None:
            await outcome.gate.wait()
        if outcome.kind == "timeout":
            await asyncio.sleep(self.timeout_sleep)
            raise PluginError(outcome.code, outcome.message, ErrorClass.UNCERTAIN)
        if outcome.kind == "final":
            raise PluginError(outcome.code, outcome.message, ErrorClass.FINAL)
        if outcome.kind == "nonfinal":
            raise PluginError(outcome.code, outcome.message, ErrorClass.UNCERTAIN)
        if outcome.kind == "transient":
            raise PluginError(outcome.code, outcome.message, ErrorClass.TRANSIENT)
        return outcome

    # ---------------------------------------------------------- capabilities

    def supports(self, source: VolumeSource) -> bool:
        if self.own:
            return source.plugin == self.name
        return source.plugin == CSI_PLUGIN and source.driver == self.driver

    def is_attachable(self, source: VolumeSource, *, inline: bool = False) -> bool:
        return self.attachable

    def is_device_mountable(self, source: VolumeSource) -> bool:
        return self.device_mountable

    def supports_block(self, source: VolumeSource) -> bool:
        return self.block and not self.own

    def supports_expansion(self, source: VolumeSource) -> bool:
        return self.expandable

    # ----------------------------------------------------------------- paths

    def _layout_for(self, root: Path) -> RootLayout:
        if self._layout is None or self._layout.root != Path(os.path.realpath(root)):
            self._layout = RootLayout(root)
        return self._layout

    def _spec_name(self, req: VolumeRequest) -> str:
        return volume_handle_dir_name(req.source.volume_handle or req.volume_id)

    def device_mount_path(self, root: Path, req: VolumeRequest) -> Path | None:
        layout = self._layout_for(root)
        if self.own:
            key = req.source.volume_handle or req.volume_id
            return self._own_staging(layout, key) if self.device_mountable else None
        if req.volume_mode == BLOCK:
            return layout.csi_block_global_map_path(self._spec_name(req))
        if not self.device_mountable:
            return None
        return layout.csi_staging_path(self.driver, req.source.volume_handle or req.volume_id)

    def pod_mount_path(self, root: Path, req: VolumeRequest) -> Path:
        layout = self._layout_for(root)
        if self.own:
            return layout.pod_volume_dir(req.pod_uid, self.pod_dir_name(), req.volume_name)
        if req.volume_mode == BLOCK:
            return layout.csi_block_pod_device_path(req.pod_uid, req.volume_name)
        return layout.csi_publish_path(req.pod_uid, req.volume_name)

    def _need_layout(self) -> RootLayout:
        if self._layout is None:
            raise PluginError("NoLayout", "paths were never asked for", ErrorClass.TRANSIENT)
        return self._layout

    # ------------------------------------------------------------ operations

    async def wait_for_attach(self, req: VolumeRequest) -> str:
        outcome = await self._follow("wait_for_attach", req)
        return str(outcome.value) if outcome.value is not None else ""

    async def mount_device(self, req: VolumeRequest) -> MountResult:
        outcome = await self._follow("mount_device", req)
        layout = self._need_layout()
        if req.volume_mode == BLOCK:
            device = self._make_block_device(layout, self._block_key(req, staged=True))
            return MountResult(path=device.loop, device_path=device.loop)
        if req.device_mount_path is not None:
            layout.ensure_dir(req.device_mount_path)
            if self.own:
                write_json(layout, req.device_mount_path.parent / RECORD, _record(req))
        if isinstance(outcome.value, MountResult):
            return outcome.value
        return MountResult(path=str(req.device_mount_path or ""))

    async def unmount_device(self, req: VolumeRequest) -> None:
        await self._follow("unmount_device", req)
        layout = self._need_layout()
        if req.volume_mode == BLOCK:
            self._drop_block_device(layout, self._block_key(req, staged=True))
            return
        if req.device_mount_path is not None:
            if self.own:
                remove_file(layout, req.device_mount_path.parent / RECORD)
            layout.remove_tree(req.device_mount_path)
            layout.remove_dir(req.device_mount_path.parent, stop_at=layout.plugin_dir(self.name))

    async def device_still_open(self, req: VolumeRequest) -> bool:
        outcome = await self._follow("device_still_open", req)
        return bool(outcome.value)

    async def set_up(self, req: VolumeRequest) -> MountResult:
        outcome = await self._follow("set_up", req)
        layout = self._need_layout()
        if isinstance(outcome.value, MountResult):
            return outcome.value
        if req.volume_mode == BLOCK:
            device = self._make_block_device(layout, self._block_key(req, self.device_mountable))
            return MountResult(path=device.loop, device_path=device.loop)
        if req.mount_path is not None:
            layout.ensure_dir(req.mount_path)
            if self.own:
                write_json(layout, self._meta_dir(layout, req) / RECORD, _record(req))
        return MountResult(path=str(req.mount_path or ""))

    async def tear_down(self, req: VolumeRequest) -> str | None:
        await self._follow("tear_down", req)
        layout = self._need_layout()
        if self.own:
            return self._tear_down_own(layout, req)
        if req.volume_mode == BLOCK:
            if not self.device_mountable:
                self._drop_block_device(layout, self._block_key(req, staged=False))
            return None
        if req.mount_path is not None:
            layout.remove_tree(req.mount_path)
            layout.remove_dir(req.mount_path.parent, stop_at=layout.pod_dir(req.pod_uid))
        return None

    async def expand(self, req: VolumeRequest, new_size: int) -> int:
        outcome = await self._follow("expand", req)
        return int(outcome.value) if isinstance(outcome.value, int) else new_size

    # ---------------------------------------- a plugin of its own: files, hooks

    def _own_staging(self, layout: RootLayout, handle: str) -> Path:
        """plugins/<plugin>/<sha256(handle)>/globalmount"""
        return layout.plugin_dir(self.name) / volume_handle_dir_name(handle) / GLOBAL_MOUNT

    def _meta_dir(self, layout: RootLayout, req: VolumeRequest) -> Path:
        """pods/<uid>/plugins/<plugin~>/<name>: where the pod volume's record is."""
        return layout.pod_plugin_dir(req.pod_uid, self.pod_dir_name(), req.volume_name)

    def _tear_down_own(self, layout: RootLayout, req: VolumeRequest) -> str | None:
        """Remove the volume dir and its record; with `keep_files` directories only."""
        meta = self._meta_dir(layout, req)
        remove_file(layout, meta / RECORD)
        layout.remove_tree(meta)
        if req.mount_path is None:
            return None
        if req.keep_files:
            kept = remove_dirs(layout, req.mount_path)
            return None if kept.gone else kept.summary(" the log did not create")
        layout.remove_tree(req.mount_path)
        return None

    def construct_volume_spec(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | str:
        """From the pod volume's record (a plugin of its own only)."""
        if not self.own or not entry.is_dir:
            return super().construct_volume_spec(layout, entry, node)
        try:
            meta = layout.pod_plugin_dir(entry.pod_uid, entry.escaped, entry.name)
        except UnsafePathError as exc:
            return str(exc)
        return self._constructed(layout, meta / RECORD, entry.name)

    def scan_global_dirs(self, layout: RootLayout) -> GlobalScan:
        """plugins/<plugin>/<sha256(handle)> per staged volume (a plugin of its own only)."""
        scan = GlobalScan()
        if not self.own:
            return scan
        root = layout.plugin_dir(self.name)
        try:
            names = list_dir(layout, root) or []
        except (UnsafePathError, OSError) as exc:
            scan.junk.append((root, f"cannot be read: {exc}"))
            return scan
        for name, is_dir in names:
            path = root / name
            if is_dir:
                scan.dirs.append(GlobalDir(self.name, path, name, path / GLOBAL_MOUNT))
            else:
                scan.junk.append((path, "a file where a staging dir belongs"))
        return scan

    def construct_device_spec(self, layout: RootLayout, entry: GlobalDir) -> ConstructedSpec | str:
        """From the global dir's record."""
        return self._constructed(layout, entry.path / RECORD, "")

    def _constructed(self, layout: RootLayout, path: Path, name: str) -> ConstructedSpec | str:
        data = read_json(layout, path)
        if isinstance(data, str):
            return data
        volume_id, handle, pv_name = (
            data.get(k, "") for k in ("volumeId", "volumeHandle", "pvName")
        )
        if not volume_id or not (name or pv_name):
            return f"{path} names no volume"
        source = VolumeSource(plugin=self.name, driver=data.get("driver", ""), volume_handle=handle)
        spec = DesiredVolume(
            name=name or pv_name, volume_id=volume_id, source=source, pv_name=pv_name
        )
        staged = self.device_mountable and pv_name
        device = self._own_staging(layout, handle or volume_id) if staged else None
        return ConstructedSpec(spec, device)

    # ---------------------------------------------------------- block devices

    def _block_key(self, req: VolumeRequest, staged: bool) -> str:
        """One loop device per volume when staged, else one per (pod, volume)."""
        raw = req.source.volume_handle or req.volume_id
        return volume_handle_dir_name(raw if staged else f"{req.pod_uid}/{raw}")

    def _make_block_device(self, layout: RootLayout, key: str) -> _BlockDevice:
        existing = self._devices.get(key)
        if existing is not None:
            return existing
        staging = layout.csi_block_staging_path(key)
        layout.ensure_dir(staging)
        backing = staging / "disk.img"
        with open(backing, "wb") as fh:
            fh.truncate(_BLOCK_FILE_BYTES)
        loop = _losetup("--find", "--show", os.fspath(backing))
        device = self._devices[key] = _BlockDevice(backing, loop)
        return device

    def _drop_block_device(self, layout: RootLayout, key: str) -> None:
        device = self._devices.pop(key, None)
        if device is None:
            return
        _losetup("--detach", device.loop)
        layout.remove_tree(device.backing.parent)

    def cleanup(self) -> None:
        """Detach every loop device this plugin made (for test teardown)."""
        for key in list(self._devices):
            device = self._devices.pop(key)
            subprocess.run(["losetup", "--detach", device.loop], check=False, capture_output=True)


def _record(req: VolumeRequest) -> dict[str, str]:
    """What a plugin of its own writes about a volume: enough to rebuild its spec."""
    return {
        "volumeId": req.volume_id,
        "volumeHandle": req.source.volume_handle,
        "driver": req.source.driver,
        "pvName": "" if req.ephemeral else req.spec_name,
    }


def _losetup(*args: str) -> str:
    proc = subprocess.run(["losetup", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PluginError(
            "Internal", f"losetup {' '.join(args)}: {proc.stderr.strip()}", ErrorClass.FINAL
        )
    return proc.stdout.strip()
