"""NodePublishVolume and NodeUnpublishVolume: bind the staged volume onto the target path."""

from __future__ import annotations

import os
import stat

from loguru import logger

from volfsm.csidriver import loopdev, mounts
from volfsm.csidriver.capability import (
    MOUNT,
    READER_MODES,
    SINGLE_WRITER_MODES,
    STRICT_SINGLE_NODE_MODES,
    Capability,
)
from volfsm.csidriver.config import Settings
from volfsm.csidriver.errors import already_exists, failed_precondition
from volfsm.csidriver.stage import detach_if_unused, live_publications, mount_filesystem
from volfsm.csidriver.state import Publication, VolumeRecord
from volfsm.csidriver.volumes import Volumes, belongs, top_mount


def _single_target_modes(settings: Settings) -> frozenset[int]:
    return STRICT_SINGLE_NODE_MODES if settings.single_node_multi_writer else SINGLE_WRITER_MODES


def _check_other_targets(
    settings: Settings, record: VolumeRecord, target: str, cap: Capability, devices: list[str]
) -> None:
    others = [t for t in live_publications(record, devices) if t != target]
    if not others:
        return
    modes = {cap.mode} | {record.published[t].mode for t in others}
    if modes & _single_target_modes(settings):
        raise failed_precondition(
            f"volume {record.volume_id} is already published at {others[0]} and its access"
            " mode allows one target path per node"
        )


def _check_staged(record: VolumeRecord, staging_path: str, cap: Capability) -> None:
    if not staging_path:
        raise failed_precondition("staging_target_path is required (STAGE_UNSTAGE_VOLUME)")
    staged = record.staged
    if staged is None or staged.path != staging_path:
        raise failed_precondition(f"volume {record.volume_id} is not staged at {staging_path}")
    if staged.access != cap.access:
        raise failed_precondition(
            f"volume {record.volume_id} is staged for {staged.access} access, not {cap.access}"
        )


def _make_target(target: str, access: str) -> bool:
    """Create the target (a directory for mount access, an empty file for block access).

    Returns whether it was created now.
    """
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        if access == MOUNT:
            os.mkdir(target, 0o750)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o640))
        return True
    want_dir = access == MOUNT
    if stat.S_ISDIR(st.st_mode) != want_dir or stat.S_ISLNK(st.st_mode):
        kind = "directory" if want_dir else "file"
        raise failed_precondition(f"target_path {target} exists and is not a {kind}")
    return False


def publish(
    volumes: Volumes,
    settings: Settings,
    volume_id: str,
    staging_path: str,
    target: str,
    cap: Capability,
    readonly: bool,
) -> None:
    """Make the volume available at target. Idempotent for the same arguments.

    An ephemeral (inline) volume is never staged: its filesystem is mounted at
    the target directly.
    """
    record = volumes.get(volume_id)
    staged = settings.stage_unstage and not record.ephemeral
    readonly = readonly or cap.mode in READER_MODES
    wanted = Publication(
        target=target,
        access=cap.access,
        readonly=readonly,
        mount_flags=list(cap.mount_flags),
        mode=cap.mode,
        staging_path=staging_path,
    )
    existing = record.published.get(target)
    if existing is not None and existing != wanted:
        raise already_exists(f"volume {volume_id} is published at {target} with other arguments")
    if staged:
        _check_staged(record, staging_path, cap)
    image = volumes.image(record)
    devices = loopdev.find(image)
    _check_other_targets(settings, record, target, cap, devices)
    if not os.path.isdir(os.path.dirname(target)):
        raise failed_precondition(f"the parent directory of target_path {target} does not exist")
    if staged and not devices:
        raise failed_precondition(f"volume {volume_id} is staged but has no loop device")
    device = devices[0] if devices else loopdev.ensure_attached(image)
    record.loop_device = device
    if cap.access == MOUNT and staged:
        staged_top = top_mount(staging_path)
        if staged_top is None or not belongs(staged_top, [device]):
            raise failed_precondition(f"volume {volume_id} is not mounted at {staging_path}")
    created = _make_target(target, cap.access)
    try:
        _mount_target(volumes, staged, record, device, wanted, cap)
    except Exception:
        if created and top_mount(target) is None:
            _remove_target(target)
        raise
    record.published[target] = wanted
    volumes.save(record)


def _mount_target(
    volumes: Volumes,
    staged: bool,
    record: VolumeRecord,
    device: str,
    pub: Publication,
    cap: Capability,
) -> None:
    """Bind (or, without staging, mount) the volume at the target unless it is there."""
    top = top_mount(pub.target)
    if top is not None:
        if belongs(top, [device]):
            return
        raise failed_precondition(f"{pub.target} is already a mount point of {top.source}")
    if cap.access != MOUNT:
        mounts.bind(device, pub.target, readonly=pub.readonly)
    elif staged:
        mounts.bind(pub.staging_path, pub.target, readonly=pub.readonly)
    else:
        mount_filesystem(volumes, record, device, pub.target, cap, readonly=pub.readonly)


def _remove_target(target: str) -> None:
    """Delete what publish created at target (an empty directory or an empty file)."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    try:
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(target)
        elif stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.unlink(target)
    except OSError as err:
        logger.warning("could not remove target_path {}: {}", target, err)


def unpublish(volumes: Volumes, settings: Settings, volume_id: str, target: str) -> None:
    """Undo publish at target: unmount and remove it. OK if not published there."""
    record = volumes.get(volume_id)
    devices = loopdev.find(volumes.image(record))
    known = target in record.published
    while (top := top_mount(target)) is not None and (known or belongs(top, devices)):
        mounts.umount(target)
    if top_mount(target) is None:
        _remove_target(target)
    record.published.pop(target, None)
    if (not settings.stage_unstage or record.ephemeral) and not record.published:
        busy = detach_if_unused(volumes, record)
        if record.ephemeral and not busy:
            volumes.save(record)
            volumes.delete(volume_id)  # an inline volume lives as long as its one publication
            return
    volumes.save(record)
