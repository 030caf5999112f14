"""Per-volume records, one JSON file per volume under the state dir, written atomically."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

VOLUME_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""Volume ids (and CreateVolume names): safe as file names, at most 128 characters."""

RECORD_SUFFIX = ".json"
IMAGE_SUFFIX = ".img"


@dataclass
class Staging:
    """Where and how the volume is staged on this node."""

    path: str
    access: str  # "mount" or "block"
    fs_type: str
    mount_flags: list[str]
    mode: int


@dataclass
class Publication:
    """One target path the volume is published at."""

    target: str
    access: str
    readonly: bool
    mount_flags: list[str]
    mode: int
    staging_path: str


@dataclass
class VolumeRecord:
    """What the driver knows about one volume; the loop device is rediscovered, not trusted."""

    volume_id: str
    capacity_bytes: int
    created_at: float = field(default_factory=time.time)
    loop_device: str | None = None
    fs_grown_to: int = 0
    staged: Staging | None = None
    published: dict[str, Publication] = field(default_factory=dict)
    ephemeral: bool = False
    """Made by NodePublish for an inline volume; deleted by its last NodeUnpublish."""

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VolumeRecord:
        """Inverse of to_json."""
        staged = data.get("staged")
        published = data.get("published") or {}
        return cls(
            volume_id=str(data["volume_id"]),
            capacity_bytes=int(data["capacity_bytes"]),
            created_at=float(data.get("created_at", 0.0)),
            loop_device=data.get("loop_device"),
            fs_grown_to=int(data.get("fs_grown_to", 0)),
            staged=Staging(**staged) if staged else None,
            published={str(k): Publication(**v) for k, v in published.items()},
            ephemeral=bool(data.get("ephemeral", False)),
        )


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON to path via a fsynced temp file and rename, then fsync the directory."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class StateStore:
    """Volume records and backing files under ``<state_dir>/volumes``."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.volumes_dir = state_dir / "volumes"
        self.volumes_dir.mkdir(parents=True, exist_ok=True)

    def image_path(self, volume_id: str) -> Path:
        """The sparse backing file of a volume."""
        return self.volumes_dir / f"{volume_id}{IMAGE_SUFFIX}"

    def record_path(self, volume_id: str) -> Path:
        """The JSON record of a volume."""
        return self.volumes_dir / f"{volume_id}{RECORD_SUFFIX}"

    def load(self, volume_id: str) -> VolumeRecord | None:
        """The record of a volume, or None if the volume does not exist."""
        if not VOLUME_ID.match(volume_id):
            return None
        try:
            data = json.loads(self.record_path(volume_id).read_text())
        except FileNotFoundError:
            return None
        return VolumeRecord.from_json(data)

    def save(self, record: VolumeRecord) -> None:
        """Write the record atomically."""
        write_json_atomic(self.record_path(record.volume_id), record.to_json())

    def remove(self, volume_id: str) -> None:
        """Forget a volume: drop its record first, then its backing file."""
        self.record_path(volume_id).unlink(missing_ok=True)
        self.image_path(volume_id).unlink(missing_ok=True)

    def all(self) -> list[VolumeRecord]:
        """Every volume record, by id."""
        records = []
        for path in sorted(self.volumes_dir.glob(f"*{RECORD_SUFFIX}")):
            try:
                record = self.load(path.name.removesuffix(RECORD_SUFFIX))
            except (ValueError, KeyError, TypeError) as err:
                logger.error("unreadable volume record {} skipped: {}", path, err)
                continue
            if record is not None:
                records.append(record)
        return records

    def orphan_images(self) -> list[Path]:
        """Backing files without a record (left by a crash in CreateVolume or DeleteVolume)."""
        return [
            image
            for image in sorted(self.volumes_dir.glob(f"*{IMAGE_SUFFIX}"))
            if not self.record_path(image.name.removesuffix(IMAGE_SUFFIX)).exists()
        ]
