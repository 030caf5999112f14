"""One copy of each repeated value in the state a start folded; its freed memory returned.

A fold decodes every event body on its own, so the state it builds holds
its own copy of every string: each pod-volume's key (pod uid, name) in the
DSW, again in the ASW (key and entry) and in the index's holders, its
volume id three times, every entry's state, operation name and plugin.
Lookups compare these copies character by character where one object
would compare by identity, and they cost memory.

`share_state` makes each of these one object, in place, after the start's
fold (values are equal, so no query, snapshot or later fold sees a
difference): the ASW's pod-volume keys and the index's holder keys become
the DSW's key tuples, entry fields the strings of their keys, volume ids
the DSW's copy, and states, operation names and plugins one interned copy
each. Entries added later by live events are not shared (the fold interns
operation and plugin names as it goes); a restart shares them.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from projections.asw import Asw, OperationRecord, PodVolumeState
from volfsm.engine.index import EngineIndex, PodVolumeKey

intern = sys.intern


def share_state(asw: Asw, entries: Mapping[PodVolumeKey, Any], index: EngineIndex) -> None:
    """Share keys and strings between the ASW, the DSW's `entries` and the index, in place."""
    share = PodVolSharer(entries)
    _share_podvols(asw, share)
    share_devices_and_holders(asw, index, share)


def share_devices_and_holders(asw: Asw, index: EngineIndex, share: PodVolSharer) -> None:
    """`share_state` of the ASW's devices and the index's holders alone (a snapshot's
    restore runs it before decoding the pod-volume entries, which then reuse the memory
    of the copies it frees)."""
    _share_devices(asw, share.vids)
    _share_holders(index, share.keys, share.vids)


class PodVolSharer:
    """Shares pod-volume entries' keys and strings with the DSW's `entries` (as `share_state`)."""

    def __init__(self, entries: Mapping[PodVolumeKey, Any]) -> None:
        self.keys: dict[PodVolumeKey, PodVolumeKey] = {key: key for key in entries}
        """DSW key -> itself (the one object each key should be)."""
        self.vids = _volume_ids(entries)

    def put(
        self,
        keys: Iterable[PodVolumeKey],
        entries: Iterable[PodVolumeState],
        into: dict[PodVolumeKey, PodVolumeState],
    ) -> None:
        """Set each entry's strings to shared copies (in place) and file it in `into`, in
        order, under the DSW's key tuple (or one with an interned volume name where the DSW
        has none)."""
        get_key, get_vid = self.keys.get, self.vids.get
        for key, pv in zip(keys, entries, strict=True):
            vid = pv.volume_id
            pv.volume_id = get_vid(vid, vid)
            shared = get_key(key) or (key[0], intern(key[1]))
            if pv.pod_uid == shared[0] and pv.volume_name == shared[1]:
                pv.pod_uid, pv.volume_name = shared
            pv.state = intern(pv.state)
            op = pv.last_operation
            if op is not None:
                op.operation = intern(op.operation)
                op.status = intern(op.status)
            if pv.last_error is not op:
                _share_record(pv.last_error)
            into[shared] = pv


def _volume_ids(entries: Mapping[PodVolumeKey, Any]) -> dict[str, str]:
    """volume id -> the DSW's own copy of it (the one its indexes are keyed by)."""
    return {dv.volume_id: dv.volume_id for _, dv in entries.values()}


def _share_podvols(asw: Asw, share: PodVolSharer) -> None:
    podvols = asw.podvols
    shared: dict[PodVolumeKey, PodVolumeState] = {}
    share.put(podvols.keys(), podvols.values(), shared)
    podvols.clear()
    podvols.update(shared)


def _share_devices(asw: Asw, vids: dict[str, str]) -> None:
    devices = asw.devices
    shared = {}
    for vid, dev in devices.items():
        if dev.volume_id == vid:
            dev.volume_id = vid = vids.get(vid, vid)
        shared[vid] = dev
        dev.state = intern(dev.state)
        dev.plugin = intern(dev.plugin)
        _share_record(dev.last_operation)
        if dev.last_error is not dev.last_operation:
            _share_record(dev.last_error)
    devices.clear()
    devices.update(shared)


def _share_record(op: OperationRecord | None) -> None:
    if op is not None:
        op.operation = intern(op.operation)
        op.status = intern(op.status)


def _share_holders(
    index: EngineIndex, keys: dict[PodVolumeKey, PodVolumeKey], vids: dict[str, str]
) -> None:
    get = keys.get
    holders = index.holders
    shared = {}
    for vid, held in holders.items():
        held[:] = [get(key) or key for key in held]
        shared[vids.get(vid, vid)] = held
    holders.clear()
    holders.update(shared)
    index.count_held()


def release_free_memory() -> None:
    """Give the heap pages a start's fold freed back to the OS (glibc `malloc_trim`).

    The fold's transient objects (rows, the child fold's output, replaced
    dict tables) are freed, but glibc keeps their pages: at 100,000
    pod-volumes some 25 MB of the process's RSS is memory it no longer uses.
    Elsewhere than glibc this does nothing.
    """
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
