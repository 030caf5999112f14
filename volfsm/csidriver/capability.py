"""Checking request fields: volume ids, paths, volume capabilities, capacity ranges."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from volfsm.csi.v1 import csi_pb2
from volfsm.csidriver.errors import invalid_argument, not_found, out_of_range
from volfsm.csidriver.fs import SUPPORTED_FS

Mode = csi_pb2.VolumeCapability.AccessMode

_KNOWN_MODES = frozenset(v.number for v in Mode.DESCRIPTOR.enum_types_by_name["Mode"].values)

MOUNT = "mount"
BLOCK = "block"

SINGLE_WRITER_MODES = frozenset({Mode.SINGLE_NODE_SINGLE_WRITER})
"""Modes that allow one target path per node, always."""

STRICT_SINGLE_NODE_MODES = frozenset(
    {Mode.SINGLE_NODE_SINGLE_WRITER, Mode.SINGLE_NODE_WRITER, Mode.SINGLE_NODE_READER_ONLY}
)
"""Modes held to one target path when SINGLE_NODE_MULTI_WRITER is advertised.

Without that capability kubelet maps ReadWriteOnce to SINGLE_NODE_WRITER and
publishes it for several pods of one node, so the driver allows it then.
"""

READER_MODES = frozenset({Mode.SINGLE_NODE_READER_ONLY, Mode.MULTI_NODE_READER_ONLY})

MIB = 1 << 20
MIN_VOLUME_BYTES = 8 * MIB
MAX_VOLUME_BYTES = 16 << 40

_MOUNT_FLAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=:/+@-]*$")
_GID = re.compile(r"^[0-9]{1,10}$")


@dataclass(frozen=True)
class Capability:
    """A VolumeCapability, checked."""

    access: str
    fs_type: str
    mount_flags: tuple[str, ...]
    mode: int
    mount_group: str = ""


def require(value: str, name: str) -> str:
    """The field's value, or INVALID_ARGUMENT if it is empty."""
    if not value:
        raise invalid_argument(f"{name} is required")
    return value


def require_path(value: str, name: str) -> str:
    """A required absolute path, normalised."""
    require(value, name)
    if not os.path.isabs(value) or "\0" in value:
        raise invalid_argument(f"{name} must be an absolute path, got {value!r}")
    return os.path.normpath(value)


def volume_path(volume_id: str, value: str) -> str:
    """Where a call says a volume is staged or published (NodeGetVolumeStats and
    NodeExpandVolume), normalised. Call it once the path is known to be set
    (`require`) and the volume to exist.

    A path that is not absolute cannot be where a volume is: NOT_FOUND, the spec's
    "volume does not exist on the specified path" (what csi-sanity expects for its
    relative "some/path").
    """
    if not os.path.isabs(value) or "\0" in value:
        raise not_found(f"volume {volume_id} is not staged or published at {value!r}")
    return os.path.normpath(value)


def optional_field(msg: Any, name: str) -> Any | None:
    """A singular message field, or None when it is not set."""
    return getattr(msg, name) if msg.HasField(name) else None


def parse_capability(cap: Any | None, name: str, *, mount_group_allowed: bool) -> Capability:
    """Check a VolumeCapability message (missing → INVALID_ARGUMENT)."""
    if cap is None:
        raise invalid_argument(f"{name} is required")
    kind = cap.WhichOneof("access_type")
    if kind is None:
        raise invalid_argument(f"{name}.access_type (block or mount) is required")
    mode = cap.access_mode.mode
    if mode == Mode.UNKNOWN or mode not in _KNOWN_MODES:
        raise invalid_argument(f"{name}.access_mode.mode is required and must be known")
    if kind == BLOCK:
        return Capability(access=BLOCK, fs_type="", mount_flags=(), mode=mode)
    fs_type = cap.mount.fs_type or SUPPORTED_FS
    if fs_type != SUPPORTED_FS:
        raise invalid_argument(f"fs_type {fs_type!r} is not supported (only ext4)")
    flags = tuple(cap.mount.mount_flags)
    for flag in flags:
        if not _MOUNT_FLAG.match(flag):
            raise invalid_argument(f"mount flag {flag!r} is not allowed")
    group = cap.mount.volume_mount_group
    if group and not mount_group_allowed:
        raise invalid_argument("volume_mount_group is set but VOLUME_MOUNT_GROUP is not offered")
    if group and not _GID.match(group):
        raise invalid_argument(f"volume_mount_group must be a numeric group id, got {group!r}")
    return Capability(
        access=MOUNT, fs_type=fs_type, mount_flags=flags, mode=mode, mount_group=group
    )


def wanted_size(capacity_range: Any, default: int) -> int:
    """Bytes to allocate for a capacity range (rounded up to MiB, within the limit)."""
    required = int(capacity_range.required_bytes) if capacity_range is not None else 0
    limit = int(capacity_range.limit_bytes) if capacity_range is not None else 0
    if required < 0 or limit < 0:
        raise invalid_argument("capacity_range bytes must not be negative")
    if limit and required > limit:
        raise out_of_range(f"required_bytes {required} exceeds limit_bytes {limit}")
    size = max(required or default, MIN_VOLUME_BYTES)
    size = -(-size // MIB) * MIB
    if limit and size > limit:
        size = limit - limit % 512
        if size < max(required, MIN_VOLUME_BYTES):
            raise out_of_range(f"limit_bytes {limit} is below the minimum {MIN_VOLUME_BYTES}")
    if size > MAX_VOLUME_BYTES:
        raise out_of_range(f"{size} bytes exceeds the maximum {MAX_VOLUME_BYTES}")
    return size


def fits(size: int, capacity_range: Any) -> bool:
    """Whether an existing size satisfies a capacity range."""
    required = int(capacity_range.required_bytes) if capacity_range is not None else 0
    limit = int(capacity_range.limit_bytes) if capacity_range is not None else 0
    return size >= required and (not limit or size <= limit)
