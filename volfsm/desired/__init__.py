"""Desired state: Kubernetes-shaped objects (`objects`, `kinds`, `volumes`), how kubectl reads
them (`loader`, `normalize`), their validation, the apply plan and the DSW."""

from volfsm.desired.dsw import DesiredStateOfWorld, PodVolume
from volfsm.desired.errors import InvalidObjectError, InvalidObjectsError, LoadError
from volfsm.desired.loader import load_objects, parse_objects
from volfsm.desired.plan import ApplyPlan, ApplyResult, DesiredChange
from volfsm.desired.quantity import parse_quantity, quantity_to_bytes
from volfsm.desired.resolve import (
    PLUGIN_CSI,
    PLUGIN_EMPTY_DIR,
    CanServe,
    csi_volume_id,
    empty_dir_volume_id,
    inline_csi_volume_id,
)

__all__ = [
    "PLUGIN_CSI",
    "PLUGIN_EMPTY_DIR",
    "ApplyPlan",
    "ApplyResult",
    "CanServe",
    "DesiredChange",
    "DesiredStateOfWorld",
    "InvalidObjectError",
    "InvalidObjectsError",
    "LoadError",
    "PodVolume",
    "csi_volume_id",
    "empty_dir_volume_id",
    "inline_csi_volume_id",
    "load_objects",
    "parse_objects",
    "parse_quantity",
    "quantity_to_bytes",
]
