"""The volumes themselves: sparse backing files and their records."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from volfsm.csidriver import loopdev, mounts
from volfsm.csidriver.capability import fits, wanted_size
from volfsm.csidriver.errors import already_exists, failed_precondition, invalid_argument, not_found
from volfsm.csidriver.state import VOLUME_ID, StateStore, VolumeRecord

_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


@dataclass(frozen=True)
class _Range:
    """A CapacityRange stand-in: the size an inline volume asks for."""

    required_bytes: int
    limit_bytes: int = 0


def parse_size(text: str) -> int:
    """An inline volume's ``size`` attribute: bytes, or a number with Ki, Mi or Gi."""
    match = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi)?", text.strip())
    if match is None:
        raise invalid_argument(f"size {text!r} must be bytes or a number with Ki, Mi or Gi")
    return int(match.group(1)) * _UNITS[match.group(2) or ""]


def belongs(entry: mounts.MountEntry, devices: list[str]) -> bool:
    """Whether a mount is of one of these loop devices (its filesystem or its device node)."""
    for device in devices:
        if entry.dev == loopdev.dev_number(device):
            return True
        if entry.fstype == "devtmpfs" and entry.root == "/" + os.path.basename(device):
            return True
    return False


def top_mount(path: str) -> mounts.MountEntry | None:
    """The topmost mount at path, if any."""
    entries = mounts.mounts_at(path)
    return entries[-1] if entries else None


class Volumes:
    """Create, look up, grow and delete volumes; find their loop devices and mounts."""

    def __init__(self, store: StateStore, default_size: int) -> None:
        self.store = store
        self.default_size = default_size

    def get(self, volume_id: str) -> VolumeRecord:
        """The volume's record, or NOT_FOUND."""
        record = self.store.load(volume_id)
        if record is None:
            raise not_found(f"volume {volume_id!r} does not exist")
        return record

    def image(self, record: VolumeRecord) -> Path:
        """The volume's backing file."""
        return self.store.image_path(record.volume_id)

    def save(self, record: VolumeRecord) -> None:
        """Persist the record (atomically)."""
        self.store.save(record)

    def create(self, name: str, capacity_range: Any) -> tuple[VolumeRecord, bool]:
        """Create a volume named name; return (record, created). Idempotent by name."""
        if not VOLUME_ID.match(name):
            raise invalid_argument(
                f"name {name!r} must be 1-128 characters of letters, digits, '.', '_' or '-'"
            )
        existing = self.store.load(name)
        if existing is not None:
            if not fits(existing.capacity_bytes, capacity_range):
                raise already_exists(
                    f"volume {name!r} exists with {existing.capacity_bytes} bytes,"
                    " outside the requested capacity_range"
                )
            return existing, False
        size = wanted_size(capacity_range, self.default_size)
        image = self.store.image_path(name)
        tmp = image.with_name(f".{image.name}.new")
        with tmp.open("wb") as f:
            f.truncate(size)
            os.fsync(f.fileno())
        os.replace(tmp, image)  # a fresh file, even over a leftover from a crash
        record = VolumeRecord(volume_id=name, capacity_bytes=size)
        self.store.save(record)
        return record, True

    def create_ephemeral(self, volume_id: str, size: str) -> VolumeRecord:
        """The inline volume `volume_id` (made on its first NodePublish, `size` as in the
        pod's volumeAttributes, else the default size). INVALID_ARGUMENT for a bad size."""
        existing = self.store.load(volume_id)
        if existing is not None:
            if not existing.ephemeral:
                raise already_exists(f"volume {volume_id!r} exists and is not an inline volume")
            return existing
        size_bytes = parse_size(size) if size else self.default_size
        record, _ = self.create(volume_id, _Range(size_bytes))
        record.ephemeral = True
        self.save(record)
        return record

    def delete(self, volume_id: str) -> bool:
        """Delete the volume if it exists and is not in use; return whether it existed."""
        record = self.store.load(volume_id)
        if record is None:
            if VOLUME_ID.match(volume_id):
                self.store.image_path(volume_id).unlink(missing_ok=True)
            return False
        devices = loopdev.find(self.image(record))
        if devices:
            raise failed_precondition(
                f"volume {volume_id!r} is in use (attached as {', '.join(devices)});"
                " unpublish and unstage it first"
            )
        self.store.remove(volume_id)
        return True

    def device_mounts(self, device: str) -> list[mounts.MountEntry]:
        """Every mount of the volume's filesystem or of its device node."""
        return mounts.mounts_of_device(loopdev.dev_number(device), device)

    def rediscover(self) -> None:
        """After a (re)start: find each volume's loop device, drop orphan files, log state."""
        for orphan in self.store.orphan_images():
            if not loopdev.find(orphan):
                logger.warning("removing backing file without a record: {}", orphan)
                orphan.unlink(missing_ok=True)
        for record in self.store.all():
            devices = loopdev.find(self.image(record))
            device = devices[0] if devices else None
            if device != record.loop_device:
                logger.info(
                    "volume {}: loop device {} (recorded {})",
                    record.volume_id,
                    device,
                    record.loop_device,
                )
                record.loop_device = device
                self.save(record)
            if record.staged is not None and device is None:
                logger.warning(
                    "volume {} is recorded as staged at {} but has no loop device;"
                    " a repeated NodeStageVolume will restore it",
                    record.volume_id,
                    record.staged.path,
                )
