"""Growing a volume: backing file, loop device, then the ext4 filesystem."""

from __future__ import annotations

import os
from typing import Any

from loguru import logger

from volfsm.csidriver import fs, loopdev, mounts
from volfsm.csidriver.capability import BLOCK, MAX_VOLUME_BYTES, MIB, MOUNT
from volfsm.csidriver.cmd import CommandFailed
from volfsm.csidriver.errors import CsiError, failed_precondition, invalid_argument, out_of_range
from volfsm.csidriver.state import VolumeRecord
from volfsm.csidriver.volumes import Volumes


def _new_size(current: int, capacity_range: Any | None) -> int:
    if capacity_range is None:
        return current
    required = int(capacity_range.required_bytes)
    limit = int(capacity_range.limit_bytes)
    if required < 0 or limit < 0:
        raise invalid_argument("capacity_range bytes must not be negative")
    if limit and limit < current:
        raise out_of_range(f"limit_bytes {limit} is below the current size {current}")
    if limit and required > limit:
        raise out_of_range(f"required_bytes {required} exceeds limit_bytes {limit}")
    if required <= current:
        return current
    size = -(-required // MIB) * MIB
    if limit and size > limit:
        size = -(-required // 512) * 512
    if size > MAX_VOLUME_BYTES:
        raise out_of_range(f"{size} bytes exceeds the maximum {MAX_VOLUME_BYTES}")
    return size


def is_filesystem_volume(record: VolumeRecord) -> bool:
    """Whether the volume is used through ext4 (never resize a block volume's content)."""
    if record.staged is not None:
        return record.staged.access == MOUNT
    if record.published:
        return any(p.access == MOUNT for p in record.published.values())
    return record.fs_grown_to > 0


def grow(volumes: Volumes, record: VolumeRecord, capacity_range: Any | None, access: str) -> int:
    """Grow file, loop device and (for filesystem volumes in use) ext4; return capacity."""
    image = volumes.image(record)
    current = image.stat().st_size
    size = _new_size(current, capacity_range)
    if size > current:
        os.truncate(image, size)
        logger.info("volume {}: backing file grown {} -> {}", record.volume_id, current, size)
    record.capacity_bytes = size
    volumes.save(record)
    devices = loopdev.find(image)
    for device in devices:
        if loopdev.size_bytes(device) != size:
            loopdev.refresh(device)
    if devices and access != BLOCK and is_filesystem_volume(record):
        grow_filesystem(volumes, record, devices[0])
    return size


def filesystem_pending(record: VolumeRecord) -> bool:
    """Whether the volume's ext4 is smaller than its backing file."""
    return record.fs_grown_to > 0 and record.fs_grown_to < record.capacity_bytes


def grow_filesystem(volumes: Volumes, record: VolumeRecord, device: str) -> None:
    """Grow the ext4 on device to fill it: online if the kernel lets us, else offline."""
    target_size = loopdev.size_bytes(device)
    if record.fs_grown_to >= target_size:
        return
    if fs.probe_type(device) != fs.SUPPORTED_FS:
        return
    devnum = loopdev.dev_number(device)
    fs_mounts = [m for m in volumes.device_mounts(device) if m.dev == devnum]
    if not fs_mounts:
        fs.grow_offline(device)
    else:
        try:
            fs.grow_online(device)
        except CommandFailed as err:
            logger.warning(
                "volume {}: online resize refused ({}); growing offline",
                record.volume_id,
                err.stderr.strip().splitlines()[-1] if err.stderr.strip() else err,
            )
            _grow_remounting(volumes, record, device, [m.mount_point for m in fs_mounts])
    record.fs_grown_to = target_size
    volumes.save(record)


def _grow_remounting(
    volumes: Volumes, record: VolumeRecord, device: str, mounted_at: list[str]
) -> None:
    """Unmount every mount of the volume, grow offline, and mount them back as they were.

    Used where the kernel refuses online growth (no CAP_SYS_RESOURCE). A mount that
    cannot be removed (busy) means the volume is in use: FAILED_PRECONDITION.
    """
    staging = record.staged.path if record.staged is not None else None
    known = ({staging} if staging else set()) | set(record.published)
    unknown = [m for m in mounted_at if m not in {mounts.canonical(k) for k in known}]
    if unknown:
        raise failed_precondition(
            f"volume {record.volume_id} is mounted at {', '.join(unknown)} unknown to the"
            " driver; its filesystem cannot be grown offline"
        )
    order = [t for t in record.published if mounts.is_mount_point(t)]
    if staging and mounts.is_mount_point(staging):
        order.append(staging)
    done: list[str] = []
    try:
        for path in order:
            mounts.umount(path)
            done.append(path)
    except CsiError as err:
        _restore(record, device, list(reversed(done)))
        raise failed_precondition(
            f"volume {record.volume_id} is in use and its filesystem cannot grow online: {err}"
        ) from err
    try:
        fs.grow_offline(device)
    finally:
        _restore(record, device, list(reversed(done)))


def _restore(record: VolumeRecord, device: str, paths: list[str]) -> None:
    """Mount back staging and publications, in this order."""
    staged = record.staged
    for path in paths:
        if staged is not None and path == staged.path:
            mounts.mount(device, path, fs.SUPPORTED_FS, staged.mount_flags)
            continue
        pub = record.published[path]
        if staged is not None:
            mounts.bind(staged.path, path, readonly=pub.readonly)
        else:
            mounts.mount(device, path, fs.SUPPORTED_FS, pub.mount_flags, readonly=pub.readonly)
