"""Failures carried over a restart: backoffs and final expansion errors, from the log.

Kubelet keeps both in memory only: after a restart every failing operation
is retried at once and a volume whose node expansion failed for good is
expanded again. volfsm folds them from the log (the ASW's last operation of
each entry) at start, before the first pass.
"""

from __future__ import annotations

import time

from projections.asw import Asw, OperationRecord
from volfsm.desired.dsw import DesiredStateOfWorld
from volfsm.engine.index import EngineIndex
from volfsm.engine.operations import (
    EXPAND_VOLUME,
    FAILED_PRECONDITION,
    MAP_VOLUME,
    UNMAP_VOLUME,
    VOLUME_MOUNT,
    VOLUME_UNMOUNT,
    OperationGenerator,
    mount_key_pod,
    unmount_key_pod,
)
from volfsm.engine.pending import NestedPendingOperations
from volfsm.engine.reconciler import Reconciler
from volfsm.plugins.base import PluginError


def restore_failures(
    *,
    asw: Asw,
    dsw: DesiredStateOfWorld,
    index: EngineIndex,
    pending: NestedPendingOperations,
    generator: OperationGenerator,
    reconciler: Reconciler,
) -> None:
    """Put back each entry's backoff still running and each final expansion error."""
    now_us = time.time_ns() // 1000
    now = pending.clock()

    def restore_one(volume_id: str, pod: str, op: OperationRecord, retry_at_us: int) -> None:
        retry_at = now + (retry_at_us - now_us) / 1e6
        message = f"{op.code}: {op.message}"
        pending.restore(volume_id, pod, op.operation, op.backoff_s, retry_at, message)

    for (uid, name), pv in asw.podvols.items():
        op = pv.last_operation
        if op is None or op.status != "failed" or op.retry_at_us is None:
            continue
        if op.retry_at_us <= now_us:
            continue
        dv = index.spec_of(uid, name)
        if dv is None:
            continue
        pod = uid
        plugin = generator.find_plugin(dv.source)
        if op.operation in (VOLUME_MOUNT, MAP_VOLUME):
            if not isinstance(plugin, PluginError):
                pod = mount_key_pod(plugin, dv, uid)
        elif op.operation in (VOLUME_UNMOUNT, UNMAP_VOLUME):
            pod = unmount_key_pod(plugin, dv, uid)
        restore_one(dv.volume_id, pod, op, op.retry_at_us)
    for vid, dev in asw.devices.items():
        op = dev.last_operation
        if op is None or op.status != "failed":
            continue
        if op.operation == EXPAND_VOLUME and op.final:
            want = dsw.desired_size(vid)
            if want is not None:
                reconciler.expand_failed[vid] = want
                if op.code == FAILED_PRECONDITION:  # in use: not tried again on this node
                    generator.expand_in_use[vid] = want
        if op.retry_at_us is not None and op.retry_at_us > now_us:
            restore_one(vid, "", op, op.retry_at_us)
