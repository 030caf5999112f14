"""A misbehaving CSI driver for tests, served in the test process over a unix socket.

It implements the Identity and Node servicers of volfsm's stubs and, by
default, says OK to everything and does nothing at all. Tests change what
a call does by putting a function in `HostileDriver.behaviour[rpc]`; the
function gets (request, context) and returns the response (or aborts).
Every request is recorded in `calls` (the plugin must pass secrets on,
so the test can see them here, and nowhere in the logs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from volfsm.csi.v1 import csi_pb2, csi_pb2_grpc

RPC = csi_pb2.NodeServiceCapability.RPC
Behaviour = Callable[[Any, Any], Any]


def varint(value: int) -> bytes:
    """Protobuf base-128 varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def with_unknown_bytes(message: Any, size: int) -> Any:
    """`message` carrying an unknown length-delimited field of `size` bytes (field 1023)."""
    message.MergeFromString(b"\xfa\x3f" + varint(size) + b"x" * size)
    return message


def with_raw(message: Any, raw: bytes) -> Any:
    """`message` with raw wire bytes merged in (e.g. a string field sent as a varint)."""
    message.MergeFromString(raw)
    return message


def mount_tmpfs(path: str, *options: str) -> None:
    """mount -t tmpfs at path (created if missing)."""
    os.makedirs(path, exist_ok=True)
    opts = ["-o", ",".join(options)] if options else []
    subprocess.run(["mount", "-t", "tmpfs", *opts, "hostile", path], check=True)


def umount_all(path: str) -> None:
    """Unmount every mount stacked at path."""
    while subprocess.run(["mountpoint", "-q", path], check=False).returncode == 0:
        subprocess.run(["umount", path], check=True)


class HostileDriver:
    """Identity + Node servicers whose answers the test scripts."""

    def __init__(self, name: str = "csi.volfsm.dev") -> None:
        self.name = name
        self.node_id = "node-1"
        self.capabilities: list[Any] = [
            csi_pb2.NodeServiceCapability(rpc=RPC(type=RPC.STAGE_UNSTAGE_VOLUME)),
            csi_pb2.NodeServiceCapability(rpc=RPC(type=RPC.EXPAND_VOLUME)),
            csi_pb2.NodeServiceCapability(rpc=RPC(type=RPC.GET_VOLUME_STATS)),
        ]
        self.behaviour: dict[str, Behaviour] = {}
        self.calls: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        self.socket_dir = Path(tempfile.mkdtemp(prefix="vcsi-hostile-", dir="/tmp"))
        self.socket = self.socket_dir / "csi.sock"
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        """unix:// endpoint of the socket."""
        return f"unix://{self.socket}"

    def start(self) -> HostileDriver:
        """Serve on the socket."""
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        csi_pb2_grpc.add_IdentityServicer_to_server(_Identity(self), server)
        csi_pb2_grpc.add_NodeServicer_to_server(_Node(self), server)
        server.add_insecure_port(self.endpoint)
        server.start()
        self._server = server
        return self

    def close(self) -> None:
        """Stop serving and remove the socket directory."""
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def requests(self, rpc: str) -> list[Any]:
        """The requests received for `rpc`, oldest first."""
        with self._lock:
            return [req for name, req in self.calls if name == rpc]

    def answer(self, rpc: str, request: Any, context: Any, default: Any) -> Any:
        """Record the call, then run the scripted behaviour (default: OK, do nothing)."""
        copy = type(request)()
        copy.CopyFrom(request)
        with self._lock:
            self.calls.append((rpc, copy))
        behaviour = self.behaviour.get(rpc)
        if behaviour is None:
            return default
        return behaviour(request, context)


class _Identity(csi_pb2_grpc.IdentityServicer):  # type: ignore[misc]
    def __init__(self, drv: HostileDriver) -> None:
        self.drv = drv

    def GetPluginInfo(self, request: Any, context: Any) -> Any:
        default = csi_pb2.GetPluginInfoResponse(name=self.drv.name, vendor_version="0.0.0-hostile")
        return self.drv.answer("GetPluginInfo", request, context, default)

    def GetPluginCapabilities(self, request: Any, context: Any) -> Any:
        default = csi_pb2.GetPluginCapabilitiesResponse()
        return self.drv.answer("GetPluginCapabilities", request, context, default)

    def Probe(self, request: Any, context: Any) -> Any:
        return self.drv.answer("Probe", request, context, csi_pb2.ProbeResponse())


class _Node(csi_pb2_grpc.NodeServicer):  # type: ignore[misc]
    def __init__(self, drv: HostileDriver) -> None:
        self.drv = drv

    def NodeStageVolume(self, request: Any, context: Any) -> Any:
        return self.drv.answer(
            "NodeStageVolume", request, context, csi_pb2.NodeStageVolumeResponse()
        )

    def NodeUnstageVolume(self, request: Any, context: Any) -> Any:
        return self.drv.answer(
            "NodeUnstageVolume", request, context, csi_pb2.NodeUnstageVolumeResponse()
        )

    def NodePublishVolume(self, request: Any, context: Any) -> Any:
        return self.drv.answer(
            "NodePublishVolume", request, context, csi_pb2.NodePublishVolumeResponse()
        )

    def NodeUnpublishVolume(self, request: Any, context: Any) -> Any:
        return self.drv.answer(
            "NodeUnpublishVolume", request, context, csi_pb2.NodeUnpublishVolumeResponse()
        )

    def NodeGetVolumeStats(self, request: Any, context: Any) -> Any:
        return self.drv.answer(
            "NodeGetVolumeStats", request, context, csi_pb2.NodeGetVolumeStatsResponse()
        )

    def NodeExpandVolume(self, request: Any, context: Any) -> Any:
        return self.drv.answer(
            "NodeExpandVolume", request, context, csi_pb2.NodeExpandVolumeResponse()
        )

    def NodeGetCapabilities(self, request: Any, context: Any) -> Any:
        default = csi_pb2.NodeGetCapabilitiesResponse(capabilities=self.drv.capabilities)
        return self.drv.answer("NodeGetCapabilities", request, context, default)

    def NodeGetInfo(self, request: Any, context: Any) -> Any:
        default = csi_pb2.NodeGetInfoResponse(node_id=self.drv.node_id)
        return self.drv.answer("NodeGetInfo", request, context, default)
