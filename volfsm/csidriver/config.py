"""The driver's settings, as given on the command line."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_NAME = "csi.volfsm.dev"
DEFAULT_VOLUME_BYTES = 64 << 20

_DRIVER_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")


def valid_driver_name(name: str) -> bool:
    """DNS-like, at most 63 characters (what GetPluginInfo may return)."""
    return bool(_DRIVER_NAME.match(name))


@dataclass(frozen=True)
class Settings:
    """Everything the services need to know about how the driver was started."""

    endpoint: str
    node_id: str
    state_dir: Path
    name: str = DEFAULT_NAME
    faults_file: Path | None = None
    call_log: Path | None = None
    stage_unstage: bool = True
    single_node_multi_writer: bool = False
    volume_mount_group: bool = False
    max_volumes_per_node: int = 0
    default_volume_bytes: int = DEFAULT_VOLUME_BYTES
    workers: int = 16
