"""Volume commands of ``volfsm-csi-driver``: create, delete and expand volumes of a running driver.

They play the part of Kubernetes' external provisioner and resizer for
volfsm's own driver, over the same socket the node service uses::

    volfsm-csi-driver create-volume demo-vol-1 --size 64Mi --endpoint unix:///run/csi.sock
    volfsm-csi-driver expand-volume demo-vol-1 --size 128Mi --endpoint unix:///run/csi.sock
    volfsm-csi-driver delete-volume demo-vol-1 --endpoint unix:///run/csi.sock

``create-volume`` prints the new volume's id (the ``volumeHandle`` for a
PersistentVolume) on stdout, ``expand-volume`` its new capacity in bytes;
``--json`` prints one JSON object instead. The endpoint defaults to
``$CSI_ENDPOINT``. Exit codes: 0 done, 1 the driver refused or could not be
reached (the message says which and why), 2 bad arguments. These commands
do not need root, only access to the socket.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from volfsm.csi.v1 import csi_pb2, csi_pb2_grpc

PROG = "volfsm-csi-driver"
COMMANDS = ("create-volume", "delete-volume", "expand-volume")
EXIT_FAILED = 1
EXIT_USAGE = 2
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_WAIT_S = 10.0

_SIZE = re.compile(r"^(?P<number>[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_POWERS = {
    "": 1,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_INT64_MAX = 2**63 - 1

Mode = csi_pb2.VolumeCapability.AccessMode.Mode


class CommandError(Exception):
    """A command failed; `exit_code` says how (1 driver or connection, 2 usage)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def parse_size(text: str) -> int:
    """Bytes of a size written as Kubernetes writes quantities: 1073741824, 1Gi, 500Mi, 2G."""
    match = _SIZE.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: a whole number of bytes with an optional suffix"
            " (Ki Mi Gi Ti Pi Ei, or k M G T P E), e.g. 64Mi or 1Gi"
        )
    size = int(match["number"]) * _POWERS[match["suffix"] or ""]
    if size <= 0 or size > _INT64_MAX:
        raise argparse.ArgumentTypeError(f"size {text!r} must be above 0 and fit in 63 bits")
    return size


def build_parser() -> argparse.ArgumentParser:
    """The volume commands and their options."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Create, expand and delete volumes of a running volfsm CSI driver.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    create = commands.add_parser(
        "create-volume",
        help="CreateVolume: a new volume; prints its id (the PV's volumeHandle)",
        description="CreateVolume; prints the volume id. Creating an existing volume of a"
        " fitting size again is not an error (the driver is idempotent by name).",
    )
    create.add_argument("name", help="volume name (letters, digits, '.', '_', '-'; 1-128)")
    create.add_argument(
        "--size", type=parse_size, help="capacity, e.g. 64Mi or 1Gi (default: the driver's)"
    )
    create.add_argument("--block", action="store_true", help="ask for raw block access")
    delete = commands.add_parser(
        "delete-volume",
        help="DeleteVolume: remove a volume that is neither staged nor published",
        description="DeleteVolume. Deleting a volume that does not exist is not an error.",
    )
    delete.add_argument("volume_id", help="the volume id create-volume printed")
    expand = commands.add_parser(
        "expand-volume",
        help="ControllerExpandVolume: grow a volume; prints the new capacity in bytes",
        description="ControllerExpandVolume. A staged filesystem volume grows on the node"
        " too; volfsm also asks NodeExpandVolume once the PV says the new size.",
    )
    expand.add_argument("volume_id", help="the volume id create-volume printed")
    expand.add_argument("--size", type=parse_size, required=True, help="new capacity, e.g. 2Gi")
    expand.add_argument("--block", action="store_true", help="the volume is used as raw block")
    for sub in (create, delete, expand):
        sub.add_argument(
            "--endpoint",
            default=os.environ.get("CSI_ENDPOINT"),
            help="the driver's unix:///path/to/csi.sock (default: $CSI_ENDPOINT)",
        )
        sub.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT_S,
            help=f"seconds to wait for the answer (default {DEFAULT_TIMEOUT_S:g})",
        )
        sub.add_argument(
            "--wait",
            type=float,
            default=DEFAULT_WAIT_S,
            help="seconds to wait for the driver's socket to appear (default"
            f" {DEFAULT_WAIT_S:g}; a driver started a moment ago may not listen yet)",
        )
        sub.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _socket_path(endpoint: str | None) -> str:
    if not endpoint:
        raise CommandError("--endpoint (or CSI_ENDPOINT) is required", EXIT_USAGE)
    if not endpoint.startswith("unix://") or not endpoint[len("unix://") :].startswith("/"):
        raise CommandError(
            f"--endpoint must look like unix:///path/to/csi.sock, got {endpoint!r}", EXIT_USAGE
        )
    return endpoint[len("unix://") :]


def wait_for_socket(endpoint: str | None, wait_s: float) -> str:
    """The endpoint's socket path once it exists; CommandError if it does not appear in time."""
    path = _socket_path(endpoint)
    deadline = time.monotonic() + max(wait_s, 0.0)
    while True:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            problem = "does not exist"
        except OSError as err:
            problem = f"cannot be checked ({err.strerror})"
        else:
            if stat.S_ISSOCK(mode):
                return path
            problem = "exists but is not a socket"
        if time.monotonic() >= deadline:
            raise CommandError(
                f"cannot reach the CSI driver: {path} {problem} (waited {wait_s:g}s);"
                f" is volfsm-csi-driver running with --endpoint {endpoint}?"
            )
        time.sleep(0.05)


def _capability(block: bool) -> Any:
    access = csi_pb2.VolumeCapability.AccessMode(mode=Mode.SINGLE_NODE_WRITER)
    if block:
        return csi_pb2.VolumeCapability(
            block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=access
        )
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type="ext4"), access_mode=access
    )


def _explain(err: grpc.RpcError, endpoint: str, timeout: float) -> str:
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else "") or ""
    if code is grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach the CSI driver at {endpoint}: {details or 'unavailable'}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the CSI driver at {endpoint} did not answer within {timeout:g}s"
    name = code.name if code is not None else "UNKNOWN"
    return f"the driver answered {name}: {details or 'no message'}"


def _create(controller: Any, args: argparse.Namespace) -> dict[str, Any]:
    request = csi_pb2.CreateVolumeRequest(
        name=args.name, volume_capabilities=[_capability(args.block)]
    )
    if args.size is not None:
        request.capacity_range.required_bytes = args.size
    resp = controller.CreateVolume(request, timeout=args.timeout)
    return {
        "volume_id": resp.volume.volume_id,
        "capacity_bytes": int(resp.volume.capacity_bytes),
    }


def _delete(controller: Any, args: argparse.Namespace) -> dict[str, Any]:
    controller.DeleteVolume(
        csi_pb2.DeleteVolumeRequest(volume_id=args.volume_id),
        timeout=args.timeout,
    )
    return {"volume_id": args.volume_id, "deleted": True}


def _expand(controller: Any, args: argparse.Namespace) -> dict[str, Any]:
    resp = controller.ControllerExpandVolume(
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=args.volume_id,
            capacity_range=csi_pb2.CapacityRange(required_bytes=args.size),
            volume_capability=_capability(args.block),
        ),
        timeout=args.timeout,
    )
    return {
        "volume_id": args.volume_id,
        "capacity_bytes": int(resp.capacity_bytes),
        "node_expansion_required": bool(resp.node_expansion_required),
    }


_RUN: dict[str, Callable[[Any, argparse.Namespace], dict[str, Any]]] = {
    "create-volume": _create,
    "delete-volume": _delete,
    "expand-volume": _expand,
}


def _plain(command: str, result: dict[str, Any]) -> tuple[str, str]:
    """(stdout line, stderr note) for a successful command."""
    if command == "create-volume":
        vid, size = result["volume_id"], result["capacity_bytes"]
        return vid, f"volume {vid} ready ({size} bytes)"
    if command == "expand-volume":
        vid, size = result["volume_id"], result["capacity_bytes"]
        return str(size), f"volume {vid} is now {size} bytes"
    return "", f"volume {result['volume_id']} deleted"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run one parsed command against the driver; the result as a dict.

    UNAVAILABLE (nobody listens on the socket yet) is retried until `--wait`
    is over: every command is idempotent, and a driver started a moment ago
    creates its socket just before it listens.
    """
    if args.timeout <= 0:
        raise CommandError("--timeout must be above 0", EXIT_USAGE)
    deadline = time.monotonic() + max(args.wait, 0.0)
    wait_for_socket(args.endpoint, args.wait)
    options = [("grpc.default_authority", "localhost")]
    with grpc.insecure_channel(args.endpoint, options=options) as channel:
        controller = csi_pb2_grpc.ControllerStub(channel)
        while True:
            try:
                return _RUN[args.command](controller, args)
            except grpc.RpcError as err:
                unavailable = hasattr(err, "code") and err.code() is grpc.StatusCode.UNAVAILABLE
                if unavailable and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                message = _explain(err, args.endpoint, args.timeout)
                raise CommandError(message) from err


def main(argv: Sequence[str]) -> int:
    """Parse and run a volume command; print the result or a one-line error."""
    args = build_parser().parse_args(list(argv))
    try:
        result = run(args)
    except CommandError as err:
        print(f"{PROG} {args.command}: {err}", file=sys.stderr)
        return err.exit_code
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    out, note = _plain(args.command, result)
    if out:
        print(out)
    print(note, file=sys.stderr)
    return 0
