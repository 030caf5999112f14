"""NodeStageVolume and NodeUnstageVolume: loop device, ext4, mount at the staging path."""

from __future__ import annotations

import os

from loguru import logger

from volfsm.csidriver import fs, loopdev, mounts
from volfsm.csidriver.capability import MOUNT, Capability
from volfsm.csidriver.errors import already_exists, failed_precondition
from volfsm.csidriver.state import Staging, VolumeRecord
from volfsm.csidriver.volumes import Volumes, belongs, top_mount


def mount_filesystem(
    volumes: Volumes,
    record: VolumeRecord,
    device: str,
    target: str,
    cap: Capability,
    *,
    readonly: bool = False,
) -> None:
    """Make sure the volume's ext4 (formatted on first use) is mounted at target."""
    top = top_mount(target)
    if top is not None:
        if belongs(top, [device]):
            return
        raise failed_precondition(f"{target} is already a mount point of {top.source}")
    if fs.ensure_ext4(device):
        record.fs_grown_to = loopdev.size_bytes(device)
        volumes.save(record)
    elif record.fs_grown_to < loopdev.size_bytes(device) and not volumes.device_mounts(device):
        # The file grew while the volume was not mounted: grow the filesystem now.
        fs.grow_offline(device)
        record.fs_grown_to = loopdev.size_bytes(device)
        volumes.save(record)
    mounts.mount(device, target, fs.SUPPORTED_FS, cap.mount_flags, readonly=readonly)
    if cap.mount_group:
        gid = int(cap.mount_group)
        os.chown(target, -1, gid)
        os.chmod(target, 0o2775)


def _staging_of(cap: Capability, path: str) -> Staging:
    return Staging(
        path=path,
        access=cap.access,
        fs_type=cap.fs_type,
        mount_flags=list(cap.mount_flags),
        mode=cap.mode,
    )


def stage(volumes: Volumes, volume_id: str, path: str, cap: Capability) -> None:
    """Attach the volume and, for filesystem access, mount it at path. Idempotent."""
    record = volumes.get(volume_id)
    wanted = _staging_of(cap, path)
    if record.staged is not None:
        if record.staged.path != path:
            raise failed_precondition(
                f"volume {volume_id} is already staged at {record.staged.path}"
            )
        if record.staged != wanted:
            raise already_exists(
                f"volume {volume_id} is already staged at {path} with another capability"
            )
    if not os.path.isdir(path):
        raise failed_precondition(
            f"staging_target_path {path} is not an existing directory (the CO creates it)"
        )
    device = loopdev.ensure_attached(volumes.image(record))
    record.loop_device = device
    if cap.access == MOUNT:
        mount_filesystem(volumes, record, device, path, cap)
    record.staged = wanted
    volumes.save(record)


def live_publications(record: VolumeRecord, devices: list[str]) -> list[str]:
    """Recorded targets that are still mounts of the volume."""
    live = []
    for target in record.published:
        top = top_mount(target)
        if top is not None and belongs(top, devices):
            live.append(target)
    return live


def umount_ours(path: str, devices: list[str]) -> None:
    """Unmount the volume's mounts stacked at path (stop at a mount of anything else)."""
    while (top := top_mount(path)) is not None and belongs(top, devices):
        mounts.umount(path)


def detach_if_unused(volumes: Volumes, record: VolumeRecord) -> list[str]:
    """Detach the volume's loop devices that nothing mounts any more.

    Returns the mount points that keep a device attached (empty when all are detached).
    """
    busy: list[str] = []
    for device in loopdev.find(volumes.image(record)):
        users = [m.mount_point for m in volumes.device_mounts(device)]
        if users:
            logger.warning("volume {}: {} still mounted at {}", record.volume_id, device, users)
            busy += users
            continue
        loopdev.detach(device)
    remaining = loopdev.find(volumes.image(record))
    record.loop_device = remaining[0] if remaining else None
    return busy


def unstage(volumes: Volumes, volume_id: str, path: str) -> None:
    """Undo stage at path: unmount, detach the loop device. OK if not staged there."""
    record = volumes.get(volume_id)
    if record.staged is not None and record.staged.path != path:
        logger.info("volume {} is staged at {}, not at {}", volume_id, record.staged.path, path)
        return
    devices = loopdev.find(volumes.image(record))
    live = live_publications(record, devices)
    if live:
        raise failed_precondition(
            f"volume {volume_id} is still published at {', '.join(live)}; unpublish it first"
        )
    record.published = {}
    umount_ours(path, devices)
    busy = detach_if_unused(volumes, record)
    if busy:
        volumes.save(record)
        raise failed_precondition(
            f"volume {volume_id} is still mounted at {', '.join(busy)}; not detached"
        )
    record.staged = None
    volumes.save(record)
