"""An asyncio client for one CSI driver's Identity and Node services.

Each call has its own deadline (kubelet uses a fixed 2 minutes; here it is
configurable) and every failure is classified as the kubelet does (see
`volfsm.plugins.csi.errors`). Requests are logged only through
`redact.redacted`, so `csi_secret` fields never reach a log line.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from loguru import logger

from volfsm.csi.v1 import csi_pb2, csi_pb2_grpc
from volfsm.plugins.base import ErrorClass, PluginError
from volfsm.plugins.csi.errors import classify, code_name
from volfsm.plugins.csi.paths import valid_driver_name
from volfsm.plugins.csi.redact import redacted

DEFAULT_TIMEOUT_S = 120.0
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_NODE_ID_BYTES = 256
RECONNECT_BACKOFF_MS = (100, 1000)
"""Initial and longest wait between reconnects to the socket (gRPC's default grows to
2 minutes; kubelet dials afresh for every call, so it sees a restarted driver at once)."""
BAD_RESPONSE = "BadDriverResponse"
UNPARSABLE_CODE = "Internal"
"""Code of a reply that is not protobuf (grpc-go: codes.Internal, "failed to unmarshal")."""
_RPC = csi_pb2.NodeServiceCapability.RPC.Type


def bad_response(rpc: str, what: str) -> PluginError:
    """The driver answered OK with something unusable (FINAL: asking again gives the same)."""
    return PluginError(BAD_RESPONSE, f"{rpc}: {what}", ErrorClass.FINAL)


def _shown(value: str, limit: int = 80) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")


CallObserver = Callable[[str, str, float], None]
"""(full method name '/csi.v1.Node/NodePublishVolume', gRPC code as Go spells it, seconds)."""
_METHOD_PREFIX = {"identity": "/csi.v1.Identity/", "node": "/csi.v1.Node/"}
GRPC_CODE_NAMES = frozenset(code_name(c) for c in grpc.StatusCode)
UNKNOWN_CODE = "Unknown"
"""The code of a failure that is no gRPC status (Go's status.Code of such an error)."""
CANCELED_CODE = "Canceled"
CONDITION_MESSAGE_LIMIT = 1000


def _cut_message(text: str) -> str:
    """A driver's condition message, at most CONDITION_MESSAGE_LIMIT characters."""
    return text if len(text) <= CONDITION_MESSAGE_LIMIT else text[:CONDITION_MESSAGE_LIMIT] + "..."


@dataclass(frozen=True)
class VolumeStatsReply:
    """What NodeGetVolumeStats said: usage numbers and, if the driver sent one, the condition."""

    usage: dict[str, int]
    abnormal: bool | None = None
    """None: the reply carried no volume condition."""
    message: str = ""


@dataclass(frozen=True)
class NodeCapabilities:
    """What the driver's Node service advertises."""

    stage_unstage: bool = False
    get_volume_stats: bool = False
    expand: bool = False
    volume_condition: bool = False
    single_node_multi_writer: bool = False
    volume_mount_group: bool = False


@dataclass(frozen=True)
class DriverInfo:
    """Identity of a driver as it answered GetPluginInfo / NodeGetInfo."""

    name: str
    vendor_version: str
    node_id: str
    max_volumes_per_node: int


def socket_path(endpoint: str) -> str:
    """The filesystem path of a `unix:///abs/path.sock` endpoint."""
    if not endpoint.startswith("unix://"):
        raise ValueError(f"CSI endpoint {endpoint!r} must look like unix:///path/to/driver.sock")
    path = endpoint[len("unix://") :]
    if not path.startswith("/"):
        raise ValueError(f"CSI endpoint {endpoint!r} must name an absolute socket path")
    return path


async def wait_for_socket(endpoint: str, timeout_s: float) -> None:
    """Wait until the driver's socket exists (the driver creates it when it listens)."""
    try:
        path = socket_path(endpoint)
    except ValueError as exc:
        raise PluginError("InvalidEndpoint", str(exc), ErrorClass.TRANSIENT) from None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            state = "does not exist"
        else:
            if stat.S_ISSOCK(mode):
                return
            state = "exists but is not a socket"
        if loop.time() >= deadline:
            raise PluginError(
                "Unavailable",
                f"CSI socket {path} did not appear within {timeout_s:g}s ({state});"
                " is the driver running?",
                ErrorClass.TRANSIENT,
            )
        await asyncio.sleep(0.05)


class CsiClient:
    """One gRPC channel to a CSI driver, with per-call deadlines."""

    def __init__(self, endpoint: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        socket_path(endpoint)
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._channel: Any = None
        self._identity: Any = None
        self._node: Any = None
        self.on_call: CallObserver | None = None
        """Told of every call's full method name, gRPC code and seconds (csi_operations_seconds)."""

    def _stubs(self) -> tuple[Any, Any]:
        if self._channel is None:
            # Kubelet dials with authority "localhost" and insecure credentials.
            initial_ms, max_ms = RECONNECT_BACKOFF_MS
            self._channel = grpc.aio.insecure_channel(
                self.endpoint,
                options=[
                    ("grpc.default_authority", "localhost"),
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.initial_reconnect_backoff_ms", initial_ms),
                    ("grpc.min_reconnect_backoff_ms", initial_ms),
                    ("grpc.max_reconnect_backoff_ms", max_ms),
                ],
            )
            self._identity = csi_pb2_grpc.IdentityStub(self._channel)
            self._node = csi_pb2_grpc.NodeStub(self._channel)
        return self._identity, self._node

    async def close(self) -> None:
        """Close the channel (a new one is opened on the next call)."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _call(self, service: str, rpc: str, request: Any) -> Any:
        started = time.perf_counter()
        code = "OK"
        try:
            return await self._send(service, rpc, request)
        except asyncio.CancelledError:
            code = CANCELED_CODE
            raise
        except PluginError as exc:
            code = exc.code if exc.code in GRPC_CODE_NAMES else UNKNOWN_CODE
            raise
        finally:
            observer = self.on_call
            if observer is not None:
                observer(_METHOD_PREFIX[service] + rpc, code, time.perf_counter() - started)

    async def _send(self, service: str, rpc: str, request: Any) -> Any:
        identity, node = self._stubs()
        stub = identity if service == "identity" else node
        logger.opt(lazy=True).debug("csi call {} {}", lambda: rpc, lambda: redacted(request))
        try:
            response = await getattr(stub, rpc)(request, timeout=self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure is classified, none escapes raw
            raise classify(exc, rpc) from exc
        if response is None:
            # grpc.aio hands back None when the reply's bytes do not parse (the sync
            # client and grpc-go raise INTERNAL): never take that for a success.
            raise PluginError(
                UNPARSABLE_CODE,
                f"{rpc}: the driver's reply could not be parsed as a {rpc}Response",
                ErrorClass.FINAL,
            )
        return response

    # ------------------------------------------------------------ identity

    async def driver_info(self) -> DriverInfo:
        """GetPluginInfo, Probe and NodeGetInfo: who the driver is and that it is ready."""
        info = await self._call("identity", "GetPluginInfo", csi_pb2.GetPluginInfoRequest())
        probe = await self._call("identity", "Probe", csi_pb2.ProbeRequest())
        if probe.HasField("ready") and not probe.ready.value:
            raise PluginError(
                "Unavailable", f"driver {info.name} says it is not ready", ErrorClass.TRANSIENT
            )
        name = str(info.name)
        if not valid_driver_name(name):
            raise bad_response(
                "GetPluginInfo", f"driver name {_shown(name)} is not a DNS-like name of 1-63 chars"
            )
        node = await self._call("node", "NodeGetInfo", csi_pb2.NodeGetInfoRequest())
        node_id = str(node.node_id)
        if not node_id or len(node_id.encode()) > MAX_NODE_ID_BYTES:
            raise bad_response(
                "NodeGetInfo", f"node_id {_shown(node_id)} must be 1-{MAX_NODE_ID_BYTES} bytes"
            )
        if node.max_volumes_per_node < 0:
            raise bad_response(
                "NodeGetInfo", f"max_volumes_per_node {node.max_volumes_per_node} is negative"
            )
        return DriverInfo(
            name=name,
            vendor_version=str(info.vendor_version),
            node_id=node_id,
            max_volumes_per_node=int(node.max_volumes_per_node),
        )

    async def node_capabilities(self) -> NodeCapabilities:
        """NodeGetCapabilities, reduced to the flags the plugin acts on."""
        resp = await self._call("node", "NodeGetCapabilities", csi_pb2.NodeGetCapabilitiesRequest())
        kinds = {c.rpc.type for c in resp.capabilities if c.HasField("rpc")}
        return NodeCapabilities(
            stage_unstage=_RPC.STAGE_UNSTAGE_VOLUME in kinds,
            get_volume_stats=_RPC.GET_VOLUME_STATS in kinds,
            expand=_RPC.EXPAND_VOLUME in kinds,
            volume_condition=_RPC.VOLUME_CONDITION in kinds,
            single_node_multi_writer=_RPC.SINGLE_NODE_MULTI_WRITER in kinds,
            volume_mount_group=_RPC.VOLUME_MOUNT_GROUP in kinds,
        )

    # ---------------------------------------------------------------- node

    async def stage(self, request: Any) -> None:
        """NodeStageVolume."""
        await self._call("node", "NodeStageVolume", request)

    async def unstage(self, volume_id: str, staging_path: str) -> None:
        """NodeUnstageVolume."""
        await self._call(
            "node",
            "NodeUnstageVolume",
            csi_pb2.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=staging_path),
        )

    async def publish(self, request: Any) -> None:
        """NodePublishVolume."""
        await self._call("node", "NodePublishVolume", request)

    async def unpublish(self, volume_id: str, target_path: str) -> None:
        """NodeUnpublishVolume."""
        await self._call(
            "node",
            "NodeUnpublishVolume",
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target_path),
        )

    async def expand(self, request: Any) -> int:
        """NodeExpandVolume; the capacity the driver reports (0 if it did not say)."""
        resp = await self._call("node", "NodeExpandVolume", request)
        capacity = int(resp.capacity_bytes)
        if capacity < 0:
            raise bad_response("NodeExpandVolume", f"capacity_bytes {capacity} is negative")
        return capacity

    async def volume_stats(
        self, volume_id: str, volume_path: str, staging_path: str = ""
    ) -> dict[str, int]:
        """NodeGetVolumeStats as {"bytes_total": .., "bytes_used": .., "inodes_total": ..}.

        Usages with an unknown unit are skipped; negative numbers are a bad response.
        """
        return (await self.volume_stats_reply(volume_id, volume_path, staging_path)).usage

    async def volume_stats_reply(
        self, volume_id: str, volume_path: str, staging_path: str = ""
    ) -> VolumeStatsReply:
        """NodeGetVolumeStats: the usage (as `volume_stats`) and the volume condition."""
        resp = await self._call(
            "node",
            "NodeGetVolumeStats",
            csi_pb2.NodeGetVolumeStatsRequest(
                volume_id=volume_id, volume_path=volume_path, staging_target_path=staging_path
            ),
        )
        units = {csi_pb2.VolumeUsage.Unit.BYTES: "bytes", csi_pb2.VolumeUsage.Unit.INODES: "inodes"}
        out: dict[str, int] = {}
        for usage in resp.usage:
            unit = units.get(usage.unit)
            if unit is None:
                continue
            numbers = {"total": usage.total, "used": usage.used, "available": usage.available}
            for key, value in numbers.items():
                if value < 0:
                    raise bad_response("NodeGetVolumeStats", f"{unit} {key} {value} is negative")
                out[f"{unit}_{key}"] = int(value)
        if not resp.HasField("volume_condition"):
            return VolumeStatsReply(out)
        condition = resp.volume_condition
        return VolumeStatsReply(out, bool(condition.abnormal), _cut_message(condition.message))
