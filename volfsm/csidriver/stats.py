"""NodeGetVolumeStats: usage of the volume's own filesystem (or size of its device), and
its condition (VOLUME_CONDITION): abnormal when the backing image is gone, or when the
mount at the path is read-only though the volume was published writable (ext4 remounts
read-only after errors). Fault injection can report an abnormal condition too
(`volfsm.csidriver.faults`, action ``abnormal``)."""

from __future__ import annotations

from volfsm.csi.v1 import csi_pb2
from volfsm.csidriver import fs, loopdev
from volfsm.csidriver.capability import BLOCK
from volfsm.csidriver.errors import not_found
from volfsm.csidriver.volumes import Volumes, belongs, top_mount

Unit = csi_pb2.VolumeUsage.Unit


def volume_stats(volumes: Volumes, volume_id: str, volume_path: str) -> list[csi_pb2.VolumeUsage]:
    """VolumeUsage entries for the volume mounted at volume_path; NOT_FOUND elsewhere."""
    record = volumes.get(volume_id)
    devices = loopdev.find(volumes.image(record))
    staged = record.staged
    block_staging = staged is not None and staged.access == BLOCK and staged.path == volume_path
    top = top_mount(volume_path)
    block_bind = top is not None and top.fstype == "devtmpfs" and belongs(top, devices)
    if devices and (block_staging or block_bind):
        size = loopdev.size_bytes(devices[0])
        return [csi_pb2.VolumeUsage(total=size, used=0, available=0, unit=Unit.BYTES)]
    if top is None or not belongs(top, devices):
        raise not_found(f"volume {volume_id} is not staged or published at {volume_path}")
    usage = fs.usage(volume_path)
    return [
        csi_pb2.VolumeUsage(
            total=usage.bytes_total,
            available=usage.bytes_available,
            used=usage.bytes_used,
            unit=Unit.BYTES,
        ),
        csi_pb2.VolumeUsage(
            total=usage.inodes_total,
            available=usage.inodes_available,
            used=usage.inodes_used,
            unit=Unit.INODES,
        ),
    ]


def volume_condition(volumes: Volumes, volume_id: str, volume_path: str) -> csi_pb2.VolumeCondition:
    """The volume's condition as seen at `volume_path` (normal unless something is wrong)."""
    record = volumes.get(volume_id)
    image = volumes.image(record)
    if not image.exists():
        return csi_pb2.VolumeCondition(
            abnormal=True, message=f"backing image {image} of volume {volume_id} is missing"
        )
    published = record.published.get(volume_path)
    top = top_mount(volume_path)
    if published is not None and not published.readonly and top is not None and top.readonly:
        return csi_pb2.VolumeCondition(
            abnormal=True,
            message=f"{volume_path} is mounted read-only though published read-write "
            "(the filesystem may have been remounted read-only after errors)",
        )
    return csi_pb2.VolumeCondition(abnormal=False, message="")
