"""Command line of the volfsm CSI driver (``volfsm-csi-driver``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from loguru import logger

from volfsm.csidriver.admin import COMMANDS
from volfsm.csidriver.admin import main as admin_main
from volfsm.csidriver.config import (
    DEFAULT_NAME,
    DEFAULT_VOLUME_BYTES,
    Settings,
    valid_driver_name,
)

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The driver's options."""
    p = argparse.ArgumentParser(
        prog="volfsm-csi-driver",
        description="volfsm's CSI driver: loop-device volumes backed by sparse files. Run as root.",
        epilog="Volume commands for a running driver (no root needed, only the socket):"
        " volfsm-csi-driver {create-volume,delete-volume,expand-volume} --help",
    )
    p.add_argument(
        "--endpoint",
        default=os.environ.get("CSI_ENDPOINT"),
        help="unix:///path/to/csi.sock (default: $CSI_ENDPOINT)",
    )
    p.add_argument("--node-id", required=True, help="node id returned by NodeGetInfo")
    p.add_argument("--state-dir", required=True, type=Path, help="volume files and records")
    p.add_argument("--name", default=DEFAULT_NAME, help=f"driver name (default {DEFAULT_NAME})")
    p.add_argument("--faults", type=Path, help="fault-injection control file (JSON)")
    p.add_argument(
        "--call-log",
        type=Path,
        help="append a JSON line per call start and end to this file (tests, debugging)",
    )
    p.add_argument("--no-stage", action="store_true", help="do not offer STAGE_UNSTAGE_VOLUME")
    p.add_argument(
        "--single-node-multi-writer",
        action="store_true",
        help="offer SINGLE_NODE_MULTI_WRITER (and hold single-node modes to one target)",
    )
    p.add_argument("--volume-mount-group", action="store_true", help="offer VOLUME_MOUNT_GROUP")
    p.add_argument("--max-volumes-per-node", type=int, default=0)
    p.add_argument(
        "--default-size",
        type=int,
        default=DEFAULT_VOLUME_BYTES,
        help="bytes for CreateVolume without a capacity range",
    )
    p.add_argument("--workers", type=int, default=16, help="gRPC worker threads")
    p.add_argument("--log-level", default="INFO")
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from parsed arguments."""
    return Settings(
        endpoint=args.endpoint,
        node_id=args.node_id,
        state_dir=args.state_dir.resolve(),
        name=args.name,
        faults_file=args.faults.resolve() if args.faults else None,
        call_log=args.call_log.resolve() if args.call_log else None,
        stage_unstage=not args.no_stage,
        single_node_multi_writer=args.single_node_multi_writer,
        volume_mount_group=args.volume_mount_group,
        max_volumes_per_node=args.max_volumes_per_node,
        default_volume_bytes=args.default_size,
        workers=args.workers,
    )


def _usage_error(message: str) -> int:
    print(f"volfsm-csi-driver: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    """Run a volume command (see `admin`), or parse arguments, check root and serve."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:
        return admin_main(argv)
    args = build_parser().parse_args(argv)
    if os.geteuid() != 0:
        return _usage_error(
            "must run as root: it attaches loop devices, runs mkfs.ext4 and mounts;"
            f" refusing to start (euid {os.geteuid()})"
        )
    if not args.endpoint:
        return _usage_error("--endpoint (or CSI_ENDPOINT) is required")
    if not valid_driver_name(args.name):
        return _usage_error(f"--name {args.name!r} is not a DNS-like name of at most 63 chars")
    if not args.node_id or len(args.node_id.encode()) > 256:
        return _usage_error("--node-id must be 1-256 bytes")
    logger.remove()
    logger.add(sys.stderr, level=args.log_level.upper(), backtrace=False, diagnose=False)

    from volfsm.csidriver.server import EndpointError, serve

    try:
        serve(settings_from(args))
    except EndpointError as err:
        return _usage_error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
