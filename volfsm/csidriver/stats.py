"""NodeGetVolumeStats: usage of the volume's own filesystem (or size of its device)."""

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
